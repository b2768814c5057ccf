"""Steering running jobs on a real database: spot to on-demand and back, starting markets."""

from __future__ import annotations

from datetime import timedelta

from broker.db.models import Job
from broker.services import agent_reports, lifecycle
from broker.services.quoting import get_planning
from broker.services.steering import market_now, steer
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen


def test_spot_attempt_moves_to_on_demand_when_slack_no_longer_covers_a_restart(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    attempt, token = run_spot(job)
    clock.advance(1800)
    agent_reports.record_progress(session, attempt.id, token, 100, f"jobs/{job.id}/k", clock.now())
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Near the deadline with most of the work left: spot can no longer be risked.
    clock.set(job.deadline - timedelta(hours=1))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def test_spot_attempt_that_alone_can_still_finish_is_kept_when_on_demand_cannot(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    attempt, token = run_spot(job)
    clock.advance(1800)
    # 90 % done on spot, none of it checkpointed: on-demand would start from zero.
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work * 0.9, None, clock.now()
    )
    job = session.get(Job, job.id)
    spot_finish = 0.1 * job.total_work / planning.rate(session, job, "V100", 1)
    od_hours = min(
        c.expected_hours
        for c in planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    )
    assert spot_finish < od_hours / 2
    clock.set(job.deadline - timedelta(hours=(spot_finish + od_hours) / 2))
    assert not planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Once even the running instance cannot finish, it moves (and the re-plan stops the job).
    clock.set(job.deadline - timedelta(hours=spot_finish / 2))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def _on_demand(session, job, clock):  # type: ignore[no-untyped-def]
    plan = {**SPOT_PLAN, "market": "on_demand"}
    attempt, token = lifecycle.begin_attempt(session, job.id, chosen(plan, 3_060_000), clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-od", clock.now(), lease_seconds=LEASE)
    return attempt, token


def test_on_demand_attempt_moves_back_to_spot_right_after_a_checkpoint(session, clock, submit):
    job = submit()
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)  # past the restart overhead
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Work past the checkpoint that a move would lose: wait for the next checkpoint.
    clock.advance(1800)
    agent_reports.record_progress(
        session, attempt.id, token, 50 + job.total_work / 4, None, clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_stays_when_spot_was_just_refused_or_the_deadline_is_close(
    session, clock, submit
):
    job = submit()
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    other = submit(budget=2_000_000_000)
    # Another job's on-demand launch there is refused: that says nothing about spot.
    od_plan = {**SPOT_PLAN, "market": "on_demand"}
    refused, _ = lifecycle.begin_attempt(session, other.id, chosen(od_plan, 3_060_000), clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Its spot launch in the zone is refused: no spot there for a while.
    refused, _ = lifecycle.begin_attempt(
        session, other.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    clock.advance(3600 * 1.5)
    agent_reports.record_progress(
        session, attempt.id, token, 60, f"jobs/{job.id}/ckpt-60", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Close to the deadline a spot start is no longer safe.
    clock.set(job.deadline - timedelta(hours=1))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_of_an_on_demand_job_never_moves(session, clock, submit):
    job = submit(market="on_demand")
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(get_planning(), session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_job_refused_spot_in_every_known_zone_starts_on_demand(session, clock, submit):
    job = submit()
    planning = get_planning()
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) is None  # the plan's
    refused, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "on_demand"
    # An hour later the refusal has aged out: spot is worth a try again.
    clock.advance(3600 * 1.5)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) is None
