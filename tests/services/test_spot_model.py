"""The shared spot model: refitted from the bundled traces and the broker's own attempts into
the database, where every process reads the same rates and histories."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from broker.core import spot_model as core
from broker.core.offers import OfferTable
from broker.db.models import Attempt, Job, SpotModelRow
from broker.services import lifecycle
from broker.services import spot_model as model
from broker.services.quoting import Planning
from broker.settings import get_settings
from pricing import spot_prior as prior
from pricing.catalog import bundled_catalog
from tests.conftest import START
from tests.helpers import SPOT_PLAN, SPOT_PRICE, chosen

P3_NO_TRACE = ("aws", "use1-az1", "p3")  # SPOT_PLAN's zone: no bundled trace (us-east-1b)
P3_TRACED = ("aws", "use1-az6", "p3")  # us-east-1a under moto's names: a V100 trace


@pytest.fixture(scope="module")
def offers() -> OfferTable:
    """The bundled catalog's AWS offers in us-east-1 and us-west-2."""
    table = bundled_catalog()
    keep = (table.provider == "aws") & np.isin(table.region, ["us-east-1", "us-west-2"])
    return table.take(np.flatnonzero(keep))


def _row(session: Session, key: tuple[str, str, str]) -> SpotModelRow:
    row = session.get(SpotModelRow, key)
    assert row is not None
    session.refresh(row)
    return row


def _index(offers: OfferTable, zone: str, instance_type: str) -> int:
    return int(np.flatnonzero((offers.zone == zone) & (offers.instance_type == instance_type))[0])


def test_trace_zones_are_the_local_clouds_zone_ids() -> None:
    moto = pytest.importorskip("moto.ec2.models.availability_zones_and_regions")
    zones = {z.name: z.zone_id for r in moto.RegionsAndZonesBackend.zones.values() for z in r}
    assert all(zones[name] == zone_id for name, zone_id in prior.TRACE_ZONE_IDS.items())


def test_refit_from_the_traces_alone(session: Session, clock: Any, offers: OfferTable) -> None:
    assert model.version(session) == 0
    written = model.refit(session, clock.now(), offers)
    keys = set(zip(offers.provider, offers.zone, core.families(offers), strict=True))
    assert written == len(keys) == len(session.exec(select(SpotModelRow)).all())
    traced = _row(session, P3_TRACED)
    assert traced.prior == "aws-02-15-2023/us-east-1a_v100_1.json"
    assert len(traced.up_runs) == len(traced.down_runs) == core.PRIOR_RUNS
    assert traced.prior_runs == 2 * core.PRIOR_RUNS and traced.observations == 0
    pooled = _row(session, ("aws", "usw2-az2", "p3"))  # us-west-2a: three V100 traces
    assert len(pooled.prior.split(",")) == 3
    fleet = _row(session, ("aws", "use1-az6", "g5"))  # a GPU no trace covers
    assert fleet.prior == prior.FLEET and len(fleet.up_runs) == core.FLEET_PRIOR_RUNS
    fleet_rate = prior.prior_stats(prior.fleet_prior()).preemptions_per_hour
    assert fleet.preemptions_per_hour == pytest.approx(fleet_rate)
    assert traced.preemptions_per_hour < fleet.preemptions_per_hour  # us-east-1a holds spot long
    assert traced.mean_window_hours == pytest.approx(1.0 / traced.preemptions_per_hour)
    assert model.version(session) == int(clock.now().timestamp() * 1_000_000)
    # nothing new: nothing rewritten, the version stays
    clock.advance(600)
    assert model.refit(session, clock.now(), offers) == 0
    assert model.version(session) < int(clock.now().timestamp() * 1_000_000)


def test_planner_risk_is_the_rate_of_the_history_the_policy_gets(
    session: Session, clock: Any, offers: OfferTable
) -> None:
    model.refit(session, clock.now(), offers)
    risk = model.risk(session, offers)
    assert risk.shape == (len(offers),)
    for key in (P3_TRACED, P3_NO_TRACE, ("aws", "usw2-az3", "g5")):
        seen = model.history(session, [key]).zones[key[1]]
        i = _index(offers, key[1], "p3.2xlarge" if key[2] == "p3" else "g5.xlarge")
        assert risk[i] == pytest.approx(core.spot_stats(seen).preemptions_per_hour, rel=1e-12)
    # an offer with no row (and a key asked of history with none) gets its prior's: the fleet's
    fleet = prior.prior_stats(prior.fleet_prior())
    other = bundled_catalog().take(np.flatnonzero(bundled_catalog().region == "eu-west-1"))
    assert np.allclose(model.risk(session, other), fleet.preemptions_per_hour)
    unknown = model.history(session, [("aws", "euw1-az1", "p3")]).zones["euw1-az1"]
    assert core.spot_stats(unknown) == fleet


def test_before_any_refit_every_offer_reads_its_prior(session: Session, offers: OfferTable) -> None:
    before = model.risk(session, offers)
    assert before.tolist() == offers.spot_risk.tolist()  # the bundled catalog's offline rates
    seen = model.history(session, [P3_TRACED]).zones["use1-az6"]
    assert len(seen.up_runs) == core.PRIOR_RUNS  # its trace's, not the fleet's
    model.refit(session, START, offers)
    assert model.risk(session, offers).tolist() == before.tolist()
    assert model.history(session, [P3_TRACED]).zones["use1-az6"] == seen


def _preempt_after(
    session: Session, clock: Any, job: Job, hours: float, run_spot: Callable[..., Any]
) -> Attempt:
    attempt, _ = run_spot(job)
    clock.advance(hours * 3600)
    lifecycle.preempted(session, attempt.id, clock.now())
    return attempt


def test_preemptions_in_a_zone_raise_its_rate_and_reach_the_policy(
    session: Session,
    clock: Any,
    offers: OfferTable,
    submit: Callable[..., Job],
    run_spot: Callable[..., Any],
) -> None:
    model.refit(session, clock.now(), offers)
    before = _row(session, P3_NO_TRACE)
    before_rate, before_window = before.preemptions_per_hour, before.mean_window_hours
    before_version = model.version(session)
    traced_rate = _row(session, P3_TRACED).preemptions_per_hour
    job = submit()
    begun = lifecycle.begin_attempt(session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now())
    assert begun is not None
    lifecycle.launch_failed(session, begun[0].id, "capacity", clock.now())  # refused
    for _ in range(6):
        clock.advance(60)
        _preempt_after(session, clock, job, 0.25, run_spot)
    clock.advance(60)
    run_spot(job)  # running for half an hour at the refit
    clock.advance(1800)

    assert model.refit(session, clock.now(), offers) == 1  # only SPOT_PLAN's zone and family
    after = _row(session, P3_NO_TRACE)
    assert after.observations == 8
    assert after.up_runs[-6:] == [0.25] * 6 and after.down_runs[-1:] == [0.1]
    assert (after.last_available, after.age_hours) == (True, 0.5)
    assert after.prior_runs == 2 * core.FLEET_PRIOR_RUNS
    assert after.preemptions_per_hour > 1.2 * before_rate
    assert after.mean_window_hours < before_window
    assert model.version(session) > before_version
    assert _row(session, P3_TRACED).preemptions_per_hour == traced_rate  # other zones unmoved

    seen = model.history(session, [P3_NO_TRACE, P3_TRACED])
    ours = seen.zones["use1-az1"]
    assert ours.up_runs[-6:] == (0.25,) * 6 and ours.last_available and ours.age_hours == 0.5
    assert seen.mean_window_hours("use1-az1") < seen.mean_window_hours("use1-az6")
    i = _index(offers, "use1-az1", "p3.2xlarge")
    assert model.risk(session, offers)[i] == pytest.approx(after.preemptions_per_hour)


def test_a_preempted_gang_counts_each_nodes_exposure_not_one_short_window(
    session: Session, clock: Any, submit: Callable[..., Job]
) -> None:
    job = submit()
    plan = dataclasses.replace(chosen(SPOT_PLAN, 4 * SPOT_PRICE), nodes=4)
    begun = lifecycle.begin_attempt(session, job.id, plan, clock.now())
    assert begun is not None
    lifecycle.launch_succeeded(session, begun[0].id, "i-0", clock.now(), lease_seconds=7200)
    clock.advance(1800)
    lifecycle.preempted(session, begun[0].id, clock.now())

    seen, count = model.observed(session, clock.now())[P3_NO_TRACE]
    # Four nodes ran half an hour each before one was preempted: two node-hours a preemption,
    # the exposure the planner's 4 x rate for this gang stands on.
    assert count == 1 and seen.up_runs == (2.0,) and not seen.last_available


def test_observations_push_the_prior_out_past_the_cap() -> None:
    observed = core.zone_history((0.5,) * (core.MAX_RUNS - 10), ())
    fields = model._fit(prior.fleet_prior(), observed, 490)[1]
    assert len(fields["up_runs"]) == core.MAX_RUNS  # type: ignore[arg-type]
    assert fields["prior_runs"] == 10 + core.FLEET_PRIOR_RUNS


READER = """
import json, sys
import numpy as np
from sqlmodel import Session
from broker.db.engine import make_engine
from broker.services import spot_model
from pricing.catalog import bundled_catalog

table = bundled_catalog()
offers = table.take(np.flatnonzero((table.provider == "aws") & (table.region == "us-east-1")))
with Session(make_engine(sys.argv[1])) as session:
    zone = spot_model.history(session, [("aws", "use1-az1", "p3")]).zones["use1-az1"]
    print(json.dumps({
        "version": spot_model.version(session),
        "risk": spot_model.risk(session, offers).tolist(),
        "up_runs": list(zone.up_runs),
    }))
"""


def _read_elsewhere(engine: Engine) -> dict[str, Any]:
    url = engine.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-c", READER, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_another_process_reads_the_same_model_and_notices_a_refit(
    db_engine: Engine,
    session: Session,
    clock: Any,
    offers: OfferTable,
    submit: Callable[..., Job],
    run_spot: Callable[..., Any],
) -> None:
    model.refit(session, clock.now(), offers)
    east = offers.take(np.flatnonzero(offers.region == "us-east-1"))
    seen = _read_elsewhere(db_engine)
    assert seen["version"] == model.version(session)
    assert seen["risk"] == model.risk(session, east).tolist()

    job = submit()
    _preempt_after(session, clock, job, 0.5, run_spot)
    model.refit(session, clock.now(), offers)
    again = _read_elsewhere(db_engine)
    assert again["version"] > seen["version"]
    assert again["up_runs"][-1] == 0.5
    assert again["risk"] == model.risk(session, east).tolist() != seen["risk"]
    with Session(db_engine) as other:  # and another session of this process
        assert model.version(other) == again["version"]


def test_a_process_reads_a_zones_history_once_per_model_version(
    session: Session,
    clock: Any,
    offers: OfferTable,
    submit: Callable[..., Job],
    run_spot: Callable[..., Any],
) -> None:
    planning = Planning.from_settings(get_settings())
    model.refit(session, clock.now(), offers)
    planning.sync(session, force=True)
    kept = planning.spot_histories(session, [P3_NO_TRACE]).zones["use1-az1"]
    assert kept == model.history(session, [P3_NO_TRACE]).zones["use1-az1"]

    job = submit()
    _preempt_after(session, clock, job, 0.5, run_spot)
    model.refit(session, clock.now(), offers)
    # the process's copy stands until its next version check ...
    assert planning.spot_histories(session, [P3_NO_TRACE]).zones["use1-az1"] == kept
    planning.sync(session, force=True)
    # ... which finds the refit and reads the row again
    again = planning.spot_histories(session, [P3_NO_TRACE]).zones["use1-az1"]
    assert again != kept and again.up_runs[-1] == 0.5
