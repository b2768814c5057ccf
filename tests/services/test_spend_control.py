"""Spend leases and live-attempt limits: spend stays bounded when nobody observes an attempt."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from broker.core.money import cost_micros
from broker.db.models import Attempt, Job, LedgerEntry
from broker.services import lifecycle
from broker.services.ledger import OVERRUN, SPEND, job_spent
from broker.services.spend_control import (
    SpendControls,
    lapsed,
    leases_due,
    live_counts,
    may_launch,
)
from tests.helpers import SPOT_PLAN, SPOT_PRICE, chosen

LEASE = 600.0


def _launch(session, clock, job, lease=LEASE, price=SPOT_PRICE):  # type: ignore[no-untyped-def]
    attempt, _ = lifecycle.begin_attempt(session, job.id, chosen(SPOT_PLAN, price), clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=lease)
    session.refresh(attempt)
    return attempt


def _booked(session, job_id, kind):  # type: ignore[no-untyped-def]
    rows = session.exec(
        select(LedgerEntry.amount_micros).where(
            LedgerEntry.job_id == job_id, LedgerEntry.kind == kind
        )
    ).all()
    return sum(rows)


def test_a_launch_grants_a_lease_of_the_asked_length(session, clock, submit):
    attempt = _launch(session, clock, submit())
    assert attempt.lease_until == clock.now() + timedelta(seconds=LEASE)


def test_booking_stops_at_the_lease_and_the_rest_is_an_overrun(session, clock, submit):
    job = submit()
    attempt = _launch(session, clock, job)
    clock.advance(3600)  # nobody observed the attempt for an hour: the loop fell behind
    ended = lifecycle.accrue(session, attempt.id, clock.now(), 60, lease_seconds=LEASE)
    assert [t.instance_id for t in ended] == ["i-1"]
    session.refresh(attempt)
    assert (attempt.status, attempt.end_reason) == ("ended", "lease")
    assert session.get(Job, job.id).status == "preempted"
    # Granted: the 600 s lease. The 3,000 s the instance may have run past it: an overrun.
    assert _booked(session, job.id, SPEND) == cost_micros(SPOT_PRICE, LEASE)
    assert _booked(session, job.id, OVERRUN) == cost_micros(SPOT_PRICE, 3600) - cost_micros(
        SPOT_PRICE, LEASE
    )
    assert job_spent(session, job.id) == attempt.cost_micros == cost_micros(SPOT_PRICE, 3600)


def test_observing_in_time_renews_the_lease_and_books_no_overrun(session, clock, submit):
    job = submit()
    attempt = _launch(session, clock, job)
    for _ in range(12):  # every 5 minutes for an hour
        clock.advance(300)
        assert lifecycle.accrue(session, attempt.id, clock.now(), 60, lease_seconds=LEASE) == []
    session.refresh(attempt)
    assert attempt.lease_until == clock.now() + timedelta(seconds=LEASE)
    assert _booked(session, job.id, OVERRUN) == 0
    assert job_spent(session, job.id) == cost_micros(SPOT_PRICE, 3600)


def test_a_lease_never_reaches_past_the_jobs_money(session, clock, submit):
    # max_cost pays for 10 minutes at $10/h (less than the job holds reserved); the lease
    # asked for is a day.
    job = submit()
    job.max_cost_micros = 1_670_000
    session.add(job)
    session.commit()
    attempt = _launch(session, clock, job, lease=86_400.0, price=10_000_000)
    money_seconds = (job.max_cost_micros) * 3600 / 10_000_000
    assert attempt.lease_until <= clock.now() + timedelta(seconds=money_seconds)
    clock.advance(86_400)
    lifecycle.accrue(session, attempt.id, clock.now(), 60, lease_seconds=86_400.0)
    granted = _booked(session, job.id, SPEND)
    assert granted <= job.max_cost_micros


def test_the_sweep_picks_leases_ending_soon_nearest_first(session, clock, submit):
    early = _launch(session, clock, submit(budget=10**9), lease=300.0)
    late = _launch(session, clock, submit(budget=10**9 + 1), lease=1200.0)
    later = _launch(session, clock, submit(budget=10**9 + 2), lease=7200.0)
    assert leases_due(session, clock.now(), 1800) == [early.id, late.id]
    assert later.id not in leases_due(session, clock.now(), 1800)
    clock.advance(400)
    assert lapsed(session, clock.now()) == (1, 100.0)


def test_live_attempt_limits_per_team_and_in_all(session, clock, submit):
    job = submit()
    _launch(session, clock, job)
    counts = live_counts(session)
    assert counts == {job.team_id: 1}
    assert not may_launch(SpendControls(max_live_per_team=1), counts, job.team_id)
    assert may_launch(SpendControls(max_live_per_team=1), counts, "team_other")
    assert not may_launch(SpendControls(max_live_total=1), counts, "team_other")
    assert may_launch(SpendControls(), counts, job.team_id)


def test_an_attempt_without_a_lease_is_swept_first(session, clock, submit):
    attempt = _launch(session, clock, submit())
    row = session.get(Attempt, attempt.id)
    row.lease_until = None  # an attempt from before leases existed
    session.add(row)
    session.commit()
    assert leases_due(session, clock.now(), 0) == [attempt.id]
    lifecycle.accrue(session, attempt.id, clock.now(), 60, lease_seconds=LEASE)
    session.refresh(row)
    assert row.lease_until == clock.now() + timedelta(seconds=LEASE)


def test_a_lease_that_ended_with_the_jobs_money_stops_the_job_for_its_budget(
    session, clock, submit
):
    job = submit()
    job.max_cost_micros = 1_670_000  # 10 minutes at $10/h
    session.add(job)
    session.commit()
    attempt = _launch(session, clock, job, lease=86_400.0, price=10_000_000)
    clock.advance(3600)  # the lease (the job's money) ended 50 minutes ago
    lifecycle.accrue(session, attempt.id, clock.now(), 60, lease_seconds=86_400.0)
    reloaded = session.get(Job, job.id)
    assert reloaded.status == "budget_exhausted", reloaded.status_reason
    assert _booked(session, job.id, SPEND) <= job.max_cost_micros
