"""The price refresh against the local clouds (boto3 and google-cloud-billing, real clients):
prices stored for every process, a snapshot per source, history pruned, failures kept out."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from broker.clock import ManualClock
from broker.core.offers import PriceObservation
from broker.db.engine import begin_write
from broker.db.models import PriceRecord, PriceSnapshot
from broker.services.job_spec import JobSpec
from broker.services.market_prices import latest, store
from broker.services.price_refresh import refresh
from broker.services.quoting import Planning
from broker.settings import Settings, get_settings
from providers.local import Fault, LocalCloud
from tests.conftest import START
from tests.helpers import job_spec

AWS_REGIONS = ["us-east-1"]
GCP_ZONES = ["us-central1-a"]


@pytest.fixture(scope="module")
def market_clock() -> ManualClock:
    """The local market's clock (the broker's ``now`` is passed to each refresh)."""
    return ManualClock(START)


@pytest.fixture(scope="module")
def cloud_module(market_clock: ManualClock) -> Iterator[LocalCloud]:
    with LocalCloud(
        aws_regions=AWS_REGIONS,
        gcp_zones=GCP_ZONES,
        market_interval_seconds=None,
        clock=market_clock,
    ) as cloud:
        yield cloud


@pytest.fixture
def cloud(cloud_module: LocalCloud) -> Iterator[LocalCloud]:
    yield cloud_module
    cloud_module.market.clear_overrides()
    cloud_module.faults.reset()


@pytest.fixture
def settings(cloud: LocalCloud, db_engine) -> Settings:  # type: ignore[no-untyped-def]
    """The broker's settings on the local clouds, checking stored prices on every call."""
    return cloud.settings(get_settings()).model_copy(update={"price_check_seconds": 0.0})


def request(engine) -> Session:  # type: ignore[no-untyped-def]
    """A session of its own, as each API request and task has (a session kept open across
    a refresh would read in its old transaction)."""
    return Session(engine, expire_on_commit=False)


def snapshots(engine) -> dict[str, PriceSnapshot]:  # type: ignore[no-untyped-def]
    with request(engine) as session:
        return {s.source: s for s in session.exec(select(PriceSnapshot)).all()}


def current(engine) -> list[PriceObservation]:  # type: ignore[no-untyped-def]
    with request(engine) as session:
        return latest(session)[0]


def synced(planning: Planning, engine) -> Planning:  # type: ignore[no-untyped-def]
    with request(engine) as session:
        planning.sync(session)
    return planning


def test_a_staged_price_change_reaches_another_process_quote_after_one_refresh(
    cloud, settings, db_engine, market_clock
):
    worker, api = Planning.from_settings(settings), Planning.from_settings(settings)
    now = market_clock.now()
    results = refresh(worker, db_engine, now)
    assert (results["aws"], results["gcp"]) == ("ok", "ok") and results["stored"] > 0
    taken = snapshots(db_engine)
    assert set(taken) == {"aws", "gcp"}
    assert all(s.error is None and s.offers > 0 and s.taken_at == now for s in taken.values())
    stored = current(db_engine)
    assert sum(s.offers for s in taken.values()) == results["stored"] >= len(stored)
    assert {o.source for o in stored} == {"aws-pricing", "aws-spot-history", "gcp-cloud-billing"}

    spec = JobSpec.model_validate(job_spec(resources={"gpus": 1, "gpu_types": ["V100"]}))
    before = synced(api, db_engine).quote(spec, now).plans[0]
    assert before.price_observed_at == now and before.price_source in {
        "aws-spot-history",
        "aws-pricing",
        "gcp-cloud-billing",
    }
    assert worker.price_version == api.price_version > 0

    later = now + timedelta(minutes=30)
    half = before.price_per_hour_micros // 2
    cloud.market.stage_price(
        later,
        before.provider,
        before.zone,
        before.instance_type,
        before.market,
        half,
        gpu=before.gpu,
    )
    market_clock.advance(30 * 60)
    assert refresh(worker, db_engine, later)["aws"] == "ok"
    assert api.quote(spec, later).plans[0].price_per_hour_micros == before.price_per_hour_micros
    after = synced(api, db_engine).quote(spec, later).plans[0]
    assert (after.zone, after.instance_type, after.market) == (
        before.zone,
        before.instance_type,
        before.market,
    )
    assert after.price_per_hour_micros == half
    assert (after.price_observed_at, after.price_source) == (later, before.price_source)


def test_a_failed_source_stores_nothing_and_keeps_the_stored_prices(
    cloud, settings, db_engine, market_clock, monkeypatch
):
    worker = Planning.from_settings(settings)
    now = market_clock.now()
    refresh(worker, db_engine, now)
    aws_before = {o for o in current(db_engine) if o.provider == "aws"}

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    cloud.faults.fail_next(1, Fault.SERVER_ERROR)  # the first call: AWS's
    later = now + timedelta(hours=1)
    results = refresh(worker, db_engine, later)
    assert results["aws"].startswith("aws refresh failed") and results["gcp"] == "ok"
    with request(db_engine) as session:
        failed = session.exec(
            select(PriceSnapshot).where(
                PriceSnapshot.source == "aws", PriceSnapshot.taken_at == later
            )
        ).one()
    assert failed.offers == 0 and failed.error == results["aws"]
    now_stored = current(db_engine)
    assert aws_before and {o for o in now_stored if o.provider == "aws"} == aws_before
    assert {o.observed_at for o in now_stored if o.provider == "gcp"} == {later}
    aws_rows = [o for o in worker.offers.offers() if o.provider == "aws"]
    assert {o.spot_as_of for o in aws_rows} <= {now, None}  # the planning kept them too


def test_the_refresh_prunes_history_older_than_price_history_days(
    cloud, settings, db_engine, market_clock
):
    worker = Planning.from_settings(settings.model_copy(update={"price_history_days": 7}))
    now = market_clock.now()
    old = PriceObservation(
        "aws",
        "us-east-1",
        "use1-az1",
        "p3.2xlarge",
        "spot",
        1,
        now - timedelta(days=8),
        "aws-spot-history",
        "V100",
    )
    with request(db_engine) as session:
        begin_write(session)
        store(session, [old])
        session.commit()
    results = refresh(worker, db_engine, now)
    assert results["pruned"] == 1
    with request(db_engine) as session:
        kept = session.exec(select(PriceRecord).where(PriceRecord.micros_per_hour == 1)).all()
    assert kept == []
