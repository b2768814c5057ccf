"""Stored prices: the history, its version, and every process's planning overlaid with it."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import delete
from sqlmodel import Session, select

from broker.core.errors import InvalidInput
from broker.core.offers import NO_PRICE, PriceObservation
from broker.db.engine import begin_write
from broker.db.models import PriceRecord
from broker.services import quoting
from broker.services.job_spec import JobSpec
from broker.services.market_prices import latest, price_rows, prune, store, version
from broker.services.plans import ChosenPlan
from broker.services.quoting import Planning
from broker.settings import get_settings
from tests.helpers import SPOT_PLAN, SPOT_PRICE, job_spec

pytestmark = pytest.mark.usefixtures("fresh_planning")


def planning(check_seconds: float = 0.0) -> Planning:
    """A planning as a process builds it (the bundled table), checking every
    ``check_seconds``."""
    settings = get_settings().model_copy(update={"price_check_seconds": check_seconds})
    return Planning.from_settings(settings)


def seen(
    at: datetime,
    micros: int,
    *,
    where: dict = SPOT_PLAN,
    market: str = "spot",
    source: str = "aws-spot-history",
    gpu: str = "",
) -> PriceObservation:
    return PriceObservation(
        provider=where["provider"],
        region=where["region"],
        zone=where["zone"],
        instance_type=where["instance_type"],
        market=market,
        micros_per_hour=micros,
        observed_at=at,
        source=source,
        gpu=gpu,
    )


def stored(session: Session, *observations: PriceObservation) -> None:
    """Store ``observations`` in one committed transaction, as a refresh does."""
    begin_write(session)
    store(session, list(observations))
    session.commit()


def spot_price(p: Planning, where: dict = SPOT_PLAN) -> tuple[int, datetime | None, str]:
    """(spot price, observed at, source) of ``where``'s row in ``p.offers``."""
    for offer in p.offers.offers():
        if (offer.provider, offer.zone, offer.instance_type) == (
            where["provider"],
            where["zone"],
            where["instance_type"],
        ):
            return offer.spot_micros_per_hour, offer.spot_as_of, offer.spot_source
    raise AssertionError(f"no row for {where}")


def test_latest_is_the_newest_row_per_key_and_the_version_the_highest_id(session, clock):
    t0 = clock.now()
    assert version(session) == 0 and latest(session) == ([], 0)
    stored(
        session,
        seen(t0, 900_000),
        seen(t0, 2_000_000, market="on_demand", source="aws-pricing"),
        seen(t0 + timedelta(hours=1), 800_000),
    )
    observations, at = latest(session)
    assert at == version(session) > 0
    by_market = {o.market: o for o in observations}
    assert len(observations) == 2
    assert by_market["spot"].micros_per_hour == 800_000
    assert by_market["spot"].observed_at == t0 + timedelta(hours=1)
    assert by_market["on_demand"].source == "aws-pricing"

    stored(session, seen(t0 + timedelta(hours=2), 700_000))
    newer, after = latest(session, after_id=at)
    assert [o.micros_per_hour for o in newer] == [700_000] and after == version(session) > at
    assert latest(session, after_id=after) == ([], after)


def test_an_n1_host_keeps_one_current_price_per_gpu(session, clock):
    n1 = {"provider": "gcp", "region": "us-central1", "zone": "us-central1-a"}
    where = {**n1, "instance_type": "n1-standard-8"}
    stored(
        session,
        seen(clock.now(), 350_000, where=where, gpu="T4", source="gcp-cloud-billing"),
        seen(clock.now(), 740_000, where=where, gpu="V100", source="gcp-cloud-billing"),
    )
    observations, _ = latest(session)
    assert sorted((o.gpu, o.micros_per_hour) for o in observations) == [
        ("T4", 350_000),
        ("V100", 740_000),
    ]


def test_prune_drops_old_history_but_never_a_current_price(session, clock):
    t0 = clock.now()
    other = {**SPOT_PLAN, "zone": "use1-az2"}
    stored(
        session,
        seen(t0, 900_000),
        seen(t0 + timedelta(days=1), 910_000),
        seen(t0 + timedelta(days=2), 920_000),  # old, but the current price of its key
        seen(t0, 500_000, where=other),  # the only, so current, price of its key
        seen(t0 + timedelta(days=40), 930_000, market="on_demand", source="aws-pricing"),
    )
    begin_write(session)
    assert prune(session, t0 + timedelta(days=30)) == 2
    session.commit()
    observations, _ = latest(session)
    assert sorted(o.micros_per_hour for o in observations) == [500_000, 920_000, 930_000]
    assert len(session.exec(select(PriceRecord)).all()) == 3


def test_sync_overlays_only_the_rows_stored_since_its_version(session, clock):
    p = planning()
    p.sync(session)  # the first sync lays the spot model's rates over the table
    assert p.price_version == 0 and p.sync(session) is False
    bundled = spot_price(p)
    assert bundled[1:] == (None, "bundled")

    stored(session, seen(clock.now(), 600_000))
    assert p.sync(session) is True
    first = p.price_version
    assert first == version(session) and spot_price(p) == (600_000, clock.now(), "aws-spot-history")
    table = p.offers
    assert p.sync(session) is False and p.offers is table  # the version did not move

    other = {**SPOT_PLAN, "zone": "use1-az2"}
    clock.advance(60)
    stored(session, seen(clock.now(), 450_000, where=other))
    # Remove the first row behind the planning's back: an incremental sync keeps what it
    # loaded before (a full reload would bring the bundled price back).
    session.execute(delete(PriceRecord).where(PriceRecord.id == first))
    session.commit()
    assert p.sync(session) is True and p.price_version > first
    assert spot_price(p)[0] == 600_000
    assert spot_price(p, other) == (450_000, clock.now(), "aws-spot-history")


def test_a_version_below_ours_reloads_over_the_bundled_table(session, clock):
    p = planning()
    bundled = spot_price(p)
    stored(session, seen(clock.now(), 600_000))
    p.sync(session)
    session.execute(delete(PriceRecord))
    session.commit()
    assert p.sync(session) is True and p.price_version == 0
    assert spot_price(p) == bundled


def test_a_price_no_longer_offered_leaves_that_market(session, clock):
    p = planning()
    stored(session, seen(clock.now(), NO_PRICE))
    p.sync(session)
    assert spot_price(p)[0] == NO_PRICE
    spots = price_rows(p.offers, gpu="V100", market="spot")
    assert all((r.zone, r.instance_type) != ("use1-az1", "p3.2xlarge") for r in spots)


def test_the_check_is_throttled_to_price_check_seconds(session, clock):
    p = planning(check_seconds=3600)
    bundled = spot_price(p)
    p.sync(session)  # checked: nothing stored (the spot model's rates laid over)
    stored(session, seen(clock.now(), 600_000))
    assert p.sync(session) is False and spot_price(p) == bundled  # not due yet
    assert p.sync(session, force=True) is True and spot_price(p)[0] == 600_000


def test_a_price_one_process_stores_reaches_the_quote_of_another(session, clock):
    refresher, api = planning(), planning()
    spec = JobSpec.model_validate(job_spec(resources={"gpus": 1, "gpu_types": ["V100"]}))
    before = api.quote(spec, clock.now()).plans[0]
    assert (before.price_observed_at, before.price_source) == (None, "bundled")

    clock.advance(600)
    where = {
        "provider": before.provider,
        "region": before.region,
        "zone": before.zone,
        "instance_type": before.instance_type,
    }
    cheaper = seen(
        clock.now(), before.price_per_hour_micros // 2, where=where, market=before.market
    )
    stored(session, cheaper)
    refresher.sync(session, force=True)
    assert api.quote(spec, clock.now()).plans[0].price_per_hour_micros == (
        before.price_per_hour_micros
    )  # the other process has not looked yet

    assert api.sync(session) is True
    after = api.quote(spec, clock.now()).plans[0]
    assert (after.zone, after.instance_type, after.market) == (
        before.zone,
        before.instance_type,
        before.market,
    )
    assert after.price_per_hour_micros == cheaper.micros_per_hour
    assert after.price_observed_at == clock.now()
    assert after.price_source == "aws-spot-history"
    assert after.expected_cost_micros < before.expected_cost_micros


def test_a_replan_and_the_admitted_plan_carry_where_their_price_came_from(session, clock, submit):
    stored(session, seen(clock.now(), 300_000))  # SPOT_PLAN's V100 at $0.30/h
    job = submit(resources={"gpus": 1, "gpu_types": ["V100"]}, market="spot")
    plan = ChosenPlan.from_json(job.plan)
    assert (plan.zone, plan.instance_type, plan.price_per_hour_micros) == (
        "use1-az1",
        "p3.2xlarge",
        300_000,
    )
    assert (plan.price_observed_at, plan.price_source) == (clock.now(), "aws-spot-history")

    clock.advance(3600)
    stored(session, seen(clock.now(), 250_000))
    best = quoting.get_planning().plans_for_job(session, job, clock.now()).choices[0]
    assert best.price_per_hour_micros == 250_000 and best.price_observed_at == clock.now()


def test_a_plan_stored_before_prices_had_an_origin_loads_as_bundled():
    old = {
        **SPOT_PLAN,
        "price_per_hour_micros": SPOT_PRICE,
        "expected_hours": 1.0,
        "expected_cost_micros": SPOT_PRICE,
        "worst_case_cost_micros": SPOT_PRICE,
        "p_deadline": 1.0,
    }
    plan = ChosenPlan.from_json(old)
    assert (plan.price_observed_at, plan.price_source) == (None, "bundled")
    assert ChosenPlan.from_json(plan.to_json()) == plan


def test_price_rows_filter_in_any_case_and_name_the_values_a_filter_may_take(session, clock):
    p = planning()
    rows = price_rows(p.offers, gpu="v100", provider="AWS", market="spot")
    assert rows and {(r.gpu, r.provider, r.market) for r in rows} == {("V100", "aws", "spot")}
    assert all(r.observed_at is None and r.source == "bundled" for r in rows)
    prices = [r.micros_per_hour for r in rows if r.gpu_count == 1]
    assert prices == sorted(prices)
    assert {r.region for r in price_rows(p.offers, region="US-EAST-1")} == {"us-east-1"}

    stored(session, seen(clock.now(), 600_000))
    p.sync(session)
    (row,) = [
        r
        for r in price_rows(p.offers, gpu="V100", market="spot")
        if (r.zone, r.instance_type) == ("use1-az1", "p3.2xlarge")
    ]
    assert (row.micros_per_hour, row.observed_at, row.source) == (
        600_000,
        clock.now(),
        "aws-spot-history",
    )

    with pytest.raises(InvalidInput) as bad_gpu:
        price_rows(p.offers, gpu="X100")
    assert bad_gpu.value.field == "gpu" and "known GPUs" in bad_gpu.value.message
    assert "V100" in bad_gpu.value.message
    with pytest.raises(InvalidInput) as bad_market:
        price_rows(p.offers, market="reserved")
    assert bad_market.value.field == "market" and "spot, on_demand" in bad_market.value.message
