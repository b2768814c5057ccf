"""The bundled catalog: the AWS snapshot joined with the GCP offers, with trace-based spot risk.

The AWS rows come from :mod:`pricing.aws_catalog`, the GCP ones are composed in
:mod:`pricing.gcp_catalog`, and spot risk from :mod:`pricing.spot_risk`.
"""

from __future__ import annotations

from functools import cache

from broker.core.offers import OfferTable
from pricing.aws_catalog import load_aws_csv
from pricing.gcp_catalog import load_gcp_offers
from pricing.spot_risk import bundled_risk_model


@cache
def bundled_catalog() -> OfferTable:
    """AWS and GCP GPU offers from the bundled snapshots, with trace-based spot risk."""
    table = OfferTable.concat(load_aws_csv(), load_gcp_offers())
    return table.replace(spot_risk=bundled_risk_model().rates_for(table.region, table.gpu))
