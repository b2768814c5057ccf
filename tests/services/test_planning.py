"""Planning for running jobs on a real database: re-plans, steering, calibration, top-ups."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session

from broker.core.errors import BudgetExceeded
from broker.core.job_status import JobStatus
from broker.db.models import Job, ThroughputCorrection
from broker.services import admission, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved
from broker.services.planning import get_planning, quote_job
from broker.services.teams import create_team
from tests.helpers import SPOT_PLAN, SPOT_PRICE, job_spec


@pytest.fixture
def session(db_engine):
    with Session(db_engine, expire_on_commit=False) as s:
        yield s


def _submit(session, clock, budget: int = 1_000_000_000, **overrides):  # type: ignore[no-untyped-def]
    team = create_team(session, f"t{budget}", budget, "month", 0.8, clock.now())
    spec = JobSpec.model_validate(job_spec(**overrides))
    job, _ = admission.submit(session, team.id, spec, clock.now())
    return job


def _running(session, job, clock, price=SPOT_PRICE):  # type: ignore[no-untyped-def]
    attempt, token = lifecycle.begin_attempt(session, job.id, SPOT_PLAN, price, clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now())
    return attempt, token


def test_replan_covers_only_the_work_left_after_the_latest_checkpoint(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    full = planning.plans_for_job(session, job, clock.now())
    attempt, token = _running(session, job, clock)
    clock.advance(3600)
    lifecycle.record_progress(session, attempt.id, token, job.total_work * 0.75, "k", clock.now())
    lifecycle.preempted(session, attempt.id, clock.now())
    job = session.get(Job, job.id)
    rest = planning.plans_for_job(session, job, clock.now())
    assert full.choices and rest.choices
    best_full, best_rest = full.choices[0].plan, rest.choices[0].plan
    assert best_rest["expected_hours"] < best_full["expected_hours"]


def test_replan_leaves_out_excluded_zones(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    best = planning.plans_for_job(session, job, clock.now()).choices[0].plan
    other = planning.plans_for_job(session, job, clock.now(), exclude_zones={best["zone"]})
    assert other.choices
    assert all(c.plan["zone"] != best["zone"] for c in other.choices)


def test_replan_with_no_budget_left_says_budget_exhausted(session, clock):
    job = _submit(session, clock, max_cost="250.00")
    attempt, _ = _running(session, job, clock, price=100_000_000)  # $100/h
    # Run until the spend has eaten all but a cent of max_cost.
    clock.advance(3600 * 249.99 / 100)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=0)
    assert session.get(Job, job.id).status == "running"
    lifecycle.preempted(session, attempt.id, clock.now())
    replan = get_planning().plans_for_job(session, session.get(Job, job.id), clock.now())
    assert replan.stop == "budget_exhausted" and not replan.choices


def test_replan_that_cannot_make_the_deadline_says_deadline_missed(session, clock):
    job = _submit(session, clock)
    clock.set(job.deadline - timedelta(minutes=5))
    replan = get_planning().plans_for_job(session, job, clock.now())
    assert replan.stop == "deadline_missed"
    assert "earliest possible finish" in (replan.reason or "")


def test_spot_attempt_moves_to_on_demand_when_slack_no_longer_covers_a_restart(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    attempt, token = _running(session, job, clock)
    clock.advance(1800)
    lifecycle.record_progress(session, attempt.id, token, 100, "k", clock.now())
    job = session.get(Job, job.id)
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Near the deadline with most of the work left: spot can no longer be risked.
    clock.set(job.deadline - timedelta(hours=1))
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def test_spot_attempt_that_alone_can_still_finish_is_kept_when_on_demand_cannot(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    attempt, token = _running(session, job, clock)
    clock.advance(1800)
    # 90 % done on spot, none of it checkpointed: on-demand would start from zero.
    lifecycle.record_progress(session, attempt.id, token, job.total_work * 0.9, None, clock.now())
    job = session.get(Job, job.id)
    spot_finish = 0.1 * job.total_work / planning._rate(session, job, "V100", 1)
    od_hours = min(
        c.plan["expected_hours"]
        for c in planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    )
    assert spot_finish < od_hours / 2
    clock.set(job.deadline - timedelta(hours=(spot_finish + od_hours) / 2))
    assert not planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Once even the running instance cannot finish, it moves (and the re-plan stops the job).
    clock.set(job.deadline - timedelta(hours=spot_finish / 2))
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def test_calibration_folds_observed_speed_into_later_quotes(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    spec = JobSpec.model_validate(job.spec)
    before = quote_job(spec, clock.now(), session).plans
    attempt, token = _running(session, job, clock)
    rate = planning._rate(session, job, "V100", 1)  # predicted work per hour
    hours = 2.0
    clock.advance(hours * 3600)
    # The GPU ran at half the predicted speed once past the restart overhead.
    lifecycle.record_progress(session, attempt.id, token, rate * 0.5 * hours, None, clock.now())
    lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    factor = planning.calibrate(session, attempt.id)
    assert factor is not None and factor < 0.8
    row = session.get(ThroughputCorrection, (job.spec["workload"]["model"], "V100"))
    assert row is not None and row.observations == 1
    after = quote_job(spec, clock.now(), session)
    v100_before = min(p.expected_hours for p in before if p.gpu == "V100")
    v100_after = min(p.expected_hours for p in after.plans if p.gpu == "V100")
    assert v100_after > v100_before * 1.2


def test_checkpoint_holding_all_work_before_preemption_succeeds(session, clock):
    job = _submit(session, clock)
    attempt, token = _running(session, job, clock)
    clock.advance(600)
    lifecycle.record_progress(session, attempt.id, token, job.total_work, "final", clock.now())
    lifecycle.preempted(session, attempt.id, clock.now())
    assert session.get(Job, job.id).status == "succeeded"
    assert job_reserved(session, job.id) == 0


def test_relaunch_tops_up_the_reservation_to_the_new_plans_worst_case(session, clock):
    job = _submit(session, clock)
    held = job_reserved(session, job.id)
    lifecycle.begin_attempt(
        session, job.id, SPOT_PLAN, SPOT_PRICE, clock.now(), reserve_up_to=held + 1_000_000
    )
    assert job_reserved(session, job.id) == held + 1_000_000


def test_top_up_beyond_the_team_budget_is_refused(session, clock):
    spec = job_spec(max_cost="250.00")
    team_budget = (
        quote_job(JobSpec.model_validate(spec), clock.now()).plans[0].worst_case_cost_micros
    )
    job = _submit(session, clock, budget=team_budget, max_cost="250.00")
    with pytest.raises(BudgetExceeded):
        lifecycle.begin_attempt(
            session, job.id, SPOT_PLAN, SPOT_PRICE, clock.now(), reserve_up_to=team_budget * 2
        )
    assert session.get(Job, job.id).status == "queued"


def _on_demand(session, job, clock):  # type: ignore[no-untyped-def]
    plan = {**SPOT_PLAN, "market": "on_demand"}
    attempt, token = lifecycle.begin_attempt(session, job.id, plan, 3_060_000, clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-od", clock.now())
    return attempt, token


def test_on_demand_attempt_moves_back_to_spot_right_after_a_checkpoint(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)  # past the restart overhead
    lifecycle.record_progress(session, attempt.id, token, 50, "ckpt-50", clock.now())
    job = session.get(Job, job.id)
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Work past the checkpoint that a move would lose: wait for the next checkpoint.
    clock.advance(1800)
    lifecycle.record_progress(
        session, attempt.id, token, 50 + job.total_work / 4, None, clock.now()
    )
    job = session.get(Job, job.id)
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_stays_when_spot_was_just_refused_or_the_deadline_is_close(
    session, clock
):
    job = _submit(session, clock)
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    lifecycle.record_progress(session, attempt.id, token, 50, "ckpt-50", clock.now())
    job = session.get(Job, job.id)
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    other = _submit(session, clock, budget=2_000_000_000)
    # Another job's on-demand launch there is refused: that says nothing about spot.
    od_plan = {**SPOT_PLAN, "market": "on_demand"}
    refused, _ = lifecycle.begin_attempt(session, other.id, od_plan, 3_060_000, clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Its spot launch in the zone is refused: no spot there for a while.
    refused, _ = lifecycle.begin_attempt(session, other.id, SPOT_PLAN, SPOT_PRICE, clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    clock.advance(3600 * 1.5)
    lifecycle.record_progress(session, attempt.id, token, 60, "ckpt-60", clock.now())
    job = session.get(Job, job.id)
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Close to the deadline a spot start is no longer safe.
    clock.set(job.deadline - timedelta(hours=1))
    assert planning.steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_of_an_on_demand_job_never_moves(session, clock):
    job = _submit(session, clock, market="on_demand")
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    lifecycle.record_progress(session, attempt.id, token, 50, "ckpt-50", clock.now())
    job = session.get(Job, job.id)
    assert get_planning().steer(session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_job_refused_spot_in_every_known_zone_starts_on_demand(session, clock):
    job = _submit(session, clock)
    planning = get_planning()
    assert planning.market_now(session, job, clock.now(), tick_hours=0.1) is None  # the plan's
    refused, _ = lifecycle.begin_attempt(session, job.id, SPOT_PLAN, SPOT_PRICE, clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert planning.market_now(session, job, clock.now(), tick_hours=0.1) == "on_demand"
    # An hour later the refusal has aged out: spot is worth a try again.
    clock.advance(3600 * 1.5)
    assert planning.market_now(session, job, clock.now(), tick_hours=0.1) is None
