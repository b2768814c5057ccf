"""Price refresh through the real clients against the local clouds: boto3 (Price List API,
spot price history, offerings) and google-cloud-billing + google-cloud-compute."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import numpy as np
import pytest

from broker.clock import ManualClock
from broker.core.offers import NO_PRICE, Offer, OfferTable, overlay
from pricing.catalog import bundled_catalog
from pricing.gcp_catalog import load_gcp_offers
from pricing.refresh import RefreshOutcome, refresh_aws, refresh_gcp
from providers.local import Fault, LocalCloud

START = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
REGIONS = ["us-east-2"]
COMPOSITION_TOLERANCE_MICROS = 10  # the GCP source rounds to 5 decimals (CATALOG.md)


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture(scope="module")
def cloud_module(clock: ManualClock) -> Iterator[LocalCloud]:
    with LocalCloud(aws_regions=REGIONS, market_interval_seconds=None, clock=clock) as cloud:
        yield cloud


@pytest.fixture
def cloud(cloud_module: LocalCloud) -> Iterator[LocalCloud]:
    yield cloud_module
    cloud_module.market.clear_overrides()
    cloud_module.faults.reset()
    cloud_module.gce.catalog.reset()


def session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


def aws(cloud: LocalCloud, table: OfferTable, now: datetime) -> RefreshOutcome:
    return refresh_aws(
        table, now, session=session(), endpoint_url=cloud.aws_endpoint_url, regions=REGIONS
    )


def gcp(cloud: LocalCloud, table: OfferTable, now: datetime) -> RefreshOutcome:
    return refresh_gcp(
        table,
        now,
        cloud.gcp_project,
        endpoint_url=cloud.gcp_endpoint_url,
        billing_endpoint_url=cloud.gcp_billing_endpoint_url,
    )


def by_key(outcome: RefreshOutcome) -> dict[tuple[str, str, str, str], object]:
    return {(o.zone, o.instance_type, o.gpu, o.market): o for o in outcome.observations}


def aws_rows() -> OfferTable:
    table = bundled_catalog()
    return table.take((table.provider == "aws") & np.isin(table.region, REGIONS))


def test_aws_refresh_reads_the_price_list_and_the_spot_history_for_every_row(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = aws_rows()
    outcome = aws(cloud, table, clock.now())
    assert (outcome.source, outcome.error) == ("aws", None)
    seen = by_key(outcome)
    for offer in table.offers():
        for market, listed, source in (
            ("on_demand", offer.on_demand_micros_per_hour, "aws-pricing"),
            ("spot", offer.spot_micros_per_hour, "aws-spot-history"),
        ):
            observed = seen.get((offer.zone, offer.instance_type, offer.gpu, market))
            if listed == NO_PRICE:
                assert observed is None  # not listed: nothing observed, the stored price stays
            else:
                assert observed is not None
                assert (observed.micros_per_hour, observed.source) == (listed, source)  # type: ignore[attr-defined]
    assert {o.observed_at for o in outcome.observations} == {clock.now()}
    assert {o.region for o in outcome.observations} == set(REGIONS)
    laid = overlay(table, outcome.observations)
    assert (laid.spot_micros_per_hour == table.spot_micros_per_hour).all()
    assert (laid.on_demand_micros_per_hour == table.on_demand_micros_per_hour).all()


def test_aws_refresh_sees_set_and_staged_market_prices(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = aws_rows()
    table = table.take(table.instance_type == "p3.2xlarge")
    clock.advance(60)
    cloud.market.set_price("aws", "use2-az2", "p3.2xlarge", "spot", 611_000)
    cloud.market.set_price("aws", "use2-az1", "p3.2xlarge", "on_demand", 2_900_000)
    later = clock.now() + timedelta(minutes=30)
    cloud.market.stage_price(later, "aws", "use2-az2", "p3.2xlarge", "spot", 1_234_000)

    seen = by_key(aws(cloud, table, clock.now()))
    assert seen["use2-az2", "p3.2xlarge", "V100", "spot"].micros_per_hour == 611_000  # type: ignore[attr-defined]
    for zone in table.zone.tolist():  # on-demand is regional
        assert seen[zone, "p3.2xlarge", "V100", "on_demand"].micros_per_hour == 2_900_000  # type: ignore[attr-defined]
    clock.advance(30 * 60)
    seen = by_key(aws(cloud, table, clock.now()))
    observed = seen["use2-az2", "p3.2xlarge", "V100", "spot"]
    assert (observed.micros_per_hour, observed.observed_at) == (1_234_000, clock.now())  # type: ignore[attr-defined]


def aws_offer(instance_type: str, zone: str) -> Offer:
    return Offer("aws", "us-east-2", zone, instance_type, "T4", 1, 16.0, 4, 16.0, 526_000, 1, 0.1)


def test_aws_rows_the_cloud_no_longer_offers_get_no_price_in_both_markets(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = OfferTable.from_offers(
        [
            aws_offer("g4dn.xlarge", "use2-az1"),
            aws_offer("g4dn.xlarge", "use2-az999"),  # a zone id the region does not have
            aws_offer("zz9.nonexistent", "use2-az1"),
        ]
    )
    seen = by_key(aws(cloud, table, clock.now()))
    assert seen["use2-az1", "g4dn.xlarge", "T4", "on_demand"].micros_per_hour > 0  # type: ignore[attr-defined]
    for zone, itype in (("use2-az999", "g4dn.xlarge"), ("use2-az1", "zz9.nonexistent")):
        for market in ("on_demand", "spot"):
            assert seen[zone, itype, "T4", market].micros_per_hour == NO_PRICE  # type: ignore[attr-defined]


def test_aws_refresh_failure_returns_the_error_and_no_observations(
    cloud: LocalCloud, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    cloud.faults.fail_next(1, Fault.SERVER_ERROR)
    outcome = aws(cloud, aws_rows(), clock.now())
    assert outcome.observations == []
    assert outcome.error is not None and outcome.error.startswith("aws refresh failed")
    unreachable = refresh_aws(
        aws_rows(), clock.now(), session=session(), endpoint_url="http://127.0.0.1:9"
    )
    assert unreachable.observations == [] and unreachable.error


def test_gcp_refresh_composes_every_bundled_offer_from_billing_skus(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = load_gcp_offers()
    outcome = gcp(cloud, table, clock.now())
    assert (outcome.source, outcome.error) == ("gcp", None)
    assert len(outcome.observations) == 2 * len(table)
    assert {(o.source, o.observed_at) for o in outcome.observations} == {
        ("gcp-cloud-billing", clock.now())
    }
    laid = overlay(table, outcome.observations)
    for listed, refreshed in (
        (table.on_demand_micros_per_hour, laid.on_demand_micros_per_hour),
        (table.spot_micros_per_hour, laid.spot_micros_per_hour),
    ):
        assert ((listed == NO_PRICE) == (refreshed == NO_PRICE)).all()
        assert np.abs(listed - refreshed).max() <= COMPOSITION_TOLERANCE_MICROS
    n1 = [o for o in outcome.observations if o.instance_type == "n1-standard-8"]
    assert {o.gpu for o in n1} == {"T4", "V100", "P100", "P4"}  # N1 observations name their GPU


def test_gcp_refresh_sees_a_price_the_market_set(cloud: LocalCloud, clock: ManualClock) -> None:
    table = load_gcp_offers()
    table = table.take(np.isin(table.zone, ["us-central1-a", "us-east1-b"]))
    cloud.market.set_price("gcp", "us-central1-a", "a2-highgpu-1g", "on_demand", 3_100_000)
    cloud.market.set_price("gcp", "us-central1-a", "n1-standard-8", "spot", 450_000, gpu="T4")
    seen = by_key(gcp(cloud, table, clock.now()))
    assert seen["us-central1-a", "a2-highgpu-1g", "A100", "on_demand"].micros_per_hour == 3_100_000  # type: ignore[attr-defined]
    assert seen["us-central1-a", "n1-standard-8", "T4", "spot"].micros_per_hour == 450_000  # type: ignore[attr-defined]
    v100 = seen["us-central1-a", "n1-standard-8", "V100", "spot"]
    bundled = table.take((table.instance_type == "n1-standard-8") & (table.gpu == "V100"))
    assert abs(v100.micros_per_hour - int(bundled.spot_micros_per_hour[0])) <= 10  # type: ignore[attr-defined]


def test_gcp_rows_in_a_zone_down_or_without_their_gpu_get_no_price(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = load_gcp_offers()
    table = table.take(np.isin(table.zone, ["us-central1-a", "us-east1-b"]))
    cloud.gce.catalog.set_up("us-east1-b", False)
    cloud.gce.catalog.withdraw("us-central1-a", "nvidia-tesla-t4")
    outcome = gcp(cloud, table, clock.now())
    bundled = {
        (o.zone, o.instance_type, o.gpu, market): price
        for o in table.offers()
        for market, price in (
            ("on_demand", o.on_demand_micros_per_hour),
            ("spot", o.spot_micros_per_hour),
        )
    }
    for o in outcome.observations:
        gone = o.zone == "us-east1-b" or (o.zone == "us-central1-a" and o.gpu == "T4")
        listed = bundled[o.zone, o.instance_type, o.gpu, o.market]
        assert (o.micros_per_hour == NO_PRICE) == (gone or listed == NO_PRICE), o


def test_gcp_refresh_failure_returns_the_error_and_no_observations(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    table = load_gcp_offers()
    cloud.faults.fail_next(1, Fault.SERVER_ERROR)
    outcome = gcp(cloud, table, clock.now())
    assert outcome.observations == []
    assert outcome.error is not None and outcome.error.startswith("gcp refresh failed")
    unreachable = refresh_gcp(
        table,
        clock.now(),
        cloud.gcp_project,
        endpoint_url=cloud.gcp_endpoint_url,
        billing_endpoint_url="http://127.0.0.1:9",
    )
    assert unreachable.observations == [] and unreachable.error


def test_a_table_without_rows_of_a_cloud_asks_it_nothing(clock: ManualClock) -> None:
    table = load_gcp_offers()
    assert refresh_aws(
        table, clock.now(), session=session(), endpoint_url="http://127.0.0.1:9"
    ) == (RefreshOutcome("aws", []))
    aws_only = bundled_catalog().take(bundled_catalog().provider == "aws")
    outcome = refresh_gcp(aws_only, clock.now(), "p", endpoint_url="http://127.0.0.1:9")
    assert outcome == RefreshOutcome("gcp", [])
