"""The bundled catalog: the AWS snapshot joined with the GCP offers, with trace-based spot risk.

The AWS rows come from :mod:`pricing.aws_catalog`, the GCP ones are composed in
:mod:`pricing.gcp_catalog`, and spot risk is the spot model's prior (:mod:`pricing.spot_prior`),
the rates a broker with a database reads too until its own attempts refine them.
"""

from __future__ import annotations

from functools import cache

from broker.core.offers import OfferTable
from pricing.aws_catalog import load_aws_csv
from pricing.gcp_catalog import load_gcp_offers
from pricing.spot_prior import prior_rates


@cache
def bundled_catalog() -> OfferTable:
    """AWS and GCP GPU offers from the bundled snapshots, with trace-based spot risk."""
    table = OfferTable.concat(load_aws_csv(), load_gcp_offers())
    return table.replace(spot_risk=prior_rates(table))
