"""Quotes and re-plans for running jobs on a real database."""

from __future__ import annotations

from datetime import timedelta

from broker.db.models import Job
from broker.services import agent_reports, lifecycle
from broker.services.quoting import get_planning
from tests.helpers import LEASE


def test_replan_covers_only_the_work_left_after_the_latest_checkpoint(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    full = planning.plans_for_job(session, job, clock.now())
    attempt, token = run_spot(job)
    clock.advance(3600)
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work * 0.75, f"jobs/{job.id}/k", clock.now()
    )
    lifecycle.preempted(session, attempt.id, clock.now())
    job = session.get(Job, job.id)
    rest = planning.plans_for_job(session, job, clock.now())
    assert full.choices and rest.choices
    best_full, best_rest = full.choices[0], rest.choices[0]
    assert best_rest.expected_hours < best_full.expected_hours


def test_replan_leaves_out_excluded_zones(session, clock, submit):
    job = submit()
    planning = get_planning()
    best = planning.plans_for_job(session, job, clock.now()).choices[0]
    other = planning.plans_for_job(session, job, clock.now(), exclude_zones={best.zone})
    assert other.choices
    assert all(c.zone != best.zone for c in other.choices)


def test_replan_with_no_budget_left_says_budget_exhausted(session, clock, submit, run_spot):
    job = submit(max_cost="250.00")
    attempt, _ = run_spot(job, price=100_000_000)  # $100/h
    # Run until the spend has eaten all but a cent of max_cost.
    clock.advance(3600 * 249.99 / 100)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=0, lease_seconds=LEASE)
    assert session.get(Job, job.id).status == "running"
    lifecycle.preempted(session, attempt.id, clock.now())
    replan = get_planning().plans_for_job(session, session.get(Job, job.id), clock.now())
    assert replan.stop == "budget_exhausted" and not replan.choices


def test_replan_that_cannot_make_the_deadline_says_deadline_missed(session, clock, submit):
    job = submit()
    clock.set(job.deadline - timedelta(minutes=5))
    replan = get_planning().plans_for_job(session, job, clock.now())
    assert replan.stop == "deadline_missed"
    assert "earliest possible finish" in (replan.reason or "")
