"""Live refresh through boto3 against moto, and google-cloud-compute against the GCE fake."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import numpy as np
import pytest
from moto import mock_aws

from broker.core.offers import Offer, OfferTable
from pricing.catalog import bundled_catalog
from pricing.refresh import refresh_aws, refresh_gcp
from providers.local.gce_fake import GceFake

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
MOTO_SPOT_MICROS = 10  # moto reports every spot price as 0.00001 $/h


def aws_offer(instance_type: str, zone: str, spot: int = 500_000) -> Offer:
    return Offer(
        "aws", "us-east-1", zone, instance_type, "T4", 1, 16.0, 1.0, 1.0, 526_000, spot, 0.1
    )


def session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@mock_aws
def test_aws_refresh_takes_spot_prices_shapes_and_offerings_from_ec2() -> None:
    zone_ids = [
        z["ZoneId"]
        for z in session().client("ec2").describe_availability_zones()["AvailabilityZones"]
    ]
    table = OfferTable.from_offers(
        [
            aws_offer("g4dn.xlarge", zone_ids[0]),
            aws_offer("g4dn.xlarge", zone_ids[1]),
            aws_offer("g4dn.xlarge", "use1-az999"),  # a zone id the region does not have
            aws_offer("zz9.nonexistent", zone_ids[0]),
        ]
    )
    result = refresh_aws(table, NOW, session=session())
    assert result.error is None
    assert result.snapshot is not None
    assert (result.snapshot.source, result.snapshot.taken_at) == ("aws", NOW)
    assert result.snapshot.rows_dropped == 2
    offers = result.table.offers()
    assert [o.zone for o in offers] == zone_ids[:2]
    for offer in offers:
        assert offer.spot_micros_per_hour == MOTO_SPOT_MICROS
        assert offer.price_as_of == NOW
        assert (offer.vcpus, offer.ram_gb, offer.gpu_memory_gb) == (4, 16.0, 16.0)
        assert offer.on_demand_micros_per_hour == 526_000  # EC2 publishes no on-demand price


@mock_aws
def test_aws_refresh_leaves_other_providers_alone() -> None:
    catalog = bundled_catalog()
    result = refresh_aws(catalog, NOW, session=session(), regions=["us-east-1"])
    assert result.error is None
    gcp = result.table.provider == "gcp"
    assert int(gcp.sum()) == int((catalog.provider == "gcp").sum())
    untouched = (result.table.provider == "aws") & (result.table.region != "us-east-1")
    assert np.isnat(result.table.price_as_of[untouched]).all()


def test_aws_refresh_failure_keeps_the_last_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    table = OfferTable.from_offers([aws_offer("g4dn.xlarge", "use1-az1")])
    result = refresh_aws(table, NOW, session=session(), endpoint_url="http://127.0.0.1:9")
    assert result.table is table
    assert result.snapshot is None
    assert result.error is not None and result.error.startswith("aws refresh failed")


def test_gcp_refresh_keeps_what_the_zones_list_and_drops_the_rest() -> None:
    catalog = bundled_catalog()
    with GceFake(["us-central1-a", "us-east1-b"]) as fake:
        result = refresh_gcp(catalog, NOW, "test-project", endpoint_url=fake.endpoint_url)
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.regions == ("us-central1", "us-east1")
    table = result.table
    gcp = table.provider == "gcp"
    assert set(table.zone[gcp].tolist()) == {"us-central1-a", "us-east1-b"}
    kinds = set(zip(table.zone[gcp].tolist(), table.instance_type[gcp].tolist(), strict=True))
    assert ("us-central1-a", "a2-highgpu-1g") in kinds
    assert ("us-central1-a", "n1-standard-8") in kinds
    assert ("us-central1-a", "a2-megagpu-16g") not in kinds  # the fake does not list it
    assert result.snapshot.rows_dropped == int((catalog.provider == "gcp").sum() - gcp.sum())
    assert int((table.provider == "aws").sum()) == int((catalog.provider == "aws").sum())


def test_gcp_refresh_failure_keeps_the_last_table() -> None:
    catalog = bundled_catalog()
    result = refresh_gcp(catalog, NOW, "test-project", endpoint_url="http://127.0.0.1:9")
    assert result.table is catalog
    assert result.error is not None and result.error.startswith("gcp refresh failed")
