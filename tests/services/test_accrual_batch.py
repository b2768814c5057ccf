"""Booking a batch of attempts in one transaction books what one-by-one accrual books."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from broker.core.job_status import JobStatus
from broker.core.money import cost_micros
from broker.db.models import Attempt, Job, LedgerEntry
from broker.services import lifecycle
from broker.services.accrual import accrue_many
from broker.services.ledger import OVERRUN, RELEASE, SPEND, job_reserved, job_spent
from tests.helpers import SPOT_PLAN, SPOT_PRICE, chosen

LEASE = 600.0
LOOKAHEAD = 60.0


def _launch(session, clock, job, lease=LEASE, price=SPOT_PRICE):  # type: ignore[no-untyped-def]
    attempt, _ = lifecycle.begin_attempt(session, job.id, chosen(SPOT_PLAN, price), clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=lease)
    session.refresh(attempt)
    return attempt


def _entries(session, job_id):  # type: ignore[no-untyped-def]
    rows = session.exec(
        select(LedgerEntry.kind, LedgerEntry.amount_micros)
        .where(LedgerEntry.job_id == job_id)
        .order_by(LedgerEntry.id)
    ).all()
    return [tuple(row) for row in rows]


def _fields(session, attempt_id):  # type: ignore[no-untyped-def]
    attempt = session.get(Attempt, attempt_id)
    session.refresh(attempt)
    started = attempt.started_at
    return (
        attempt.billed_seconds,
        attempt.cost_micros,
        attempt.lease_until - started,
        attempt.status,
    )


def test_a_batch_books_and_renews_as_one_by_one_accrual_does(session, clock, submit):
    together = [_launch(session, clock, submit(budget=10**9 + i)) for i in range(3)]
    alone = [_launch(session, clock, submit(budget=2 * 10**9 + i)) for i in range(3)]
    for step in (45.0, 300.0, 301.5, 599.0):  # under the minimum, then per second
        clock.advance(step)
        now = clock.now()
        result = accrue_many(
            session, [(a.id, now) for a in together], LOOKAHEAD, lease_seconds=LEASE
        )
        assert result.booked == [a.id for a in together]
        assert result.one_by_one == result.idle == []
        for attempt in alone:
            assert lifecycle.accrue(session, attempt.id, now, LOOKAHEAD, lease_seconds=LEASE) == []
    for mine, theirs in zip(together, alone, strict=True):
        assert _fields(session, mine.id) == _fields(session, theirs.id)
        assert _entries(session, mine.job_id)[1:] == _entries(session, theirs.job_id)[1:]
        assert job_reserved(session, mine.job_id) == job_reserved(session, theirs.job_id)
    elapsed = 45.0 + 300.0 + 301.5 + 599.0
    spent = cost_micros(SPOT_PRICE, elapsed)
    assert [job_spent(session, a.job_id) for a in together] == [spent] * 3
    attempt = session.get(Attempt, together[0].id)
    assert attempt.lease_until == clock.now() + timedelta(seconds=LEASE)
    kinds = [kind for kind, _ in _entries(session, together[0].job_id)]
    assert kinds == ["reserve"] + [SPEND, RELEASE] * 4


def test_what_is_not_the_common_case_is_left_untouched_for_one_by_one_accrual(
    session, clock, submit
):
    lapsing = _launch(session, clock, submit(budget=10**9 + 1), lease=300.0)
    poor = submit(budget=10**9 + 2)
    poor.max_cost_micros = cost_micros(SPOT_PRICE, 400.0)  # under the next lookahead soon
    session.add(poor)
    session.commit()
    short = _launch(session, clock, poor, lease=86_400.0)
    ended = _launch(session, clock, submit(budget=10**9 + 3))
    lifecycle.stop(session, ended.job_id, JobStatus.CANCELLED, "test", clock.now())
    fine = _launch(session, clock, submit(budget=10**9 + 4))
    before = {a.id: _entries(session, a.job_id) for a in (lapsing, short, ended)}
    clock.advance(360.0)  # past the 300 s lease; 40 s of the poor job's money left
    now = clock.now()
    ids = [lapsing.id, short.id, ended.id, fine.id]
    result = accrue_many(session, [(i, now) for i in ids], LOOKAHEAD, lease_seconds=LEASE)
    assert result.booked == [fine.id]
    assert result.one_by_one == [lapsing.id, short.id]
    assert result.idle == [ended.id]
    assert {a.id: _entries(session, a.job_id) for a in (lapsing, short, ended)} == before
    # one by one, they end as they always have
    lifecycle.accrue(session, lapsing.id, now, LOOKAHEAD, lease_seconds=LEASE)
    assert session.get(Job, lapsing.job_id).status == "preempted"
    assert [k for k, _ in _entries(session, lapsing.job_id)].count(OVERRUN) == 1
    lifecycle.accrue(session, short.id, now, LOOKAHEAD, lease_seconds=LEASE)
    assert session.get(Job, poor.id).status == "budget_exhausted"


def test_a_lease_that_needs_the_team_to_top_up_is_left_alone_and_the_top_up_lasts(
    session, clock, submit
):
    job = submit()
    attempt = _launch(session, clock, job)
    held = job_reserved(session, job.id)
    # a lease longer than what the job holds: renewing it takes the team's free budget
    lease = (held + 1_000_000) * 3600 / SPOT_PRICE
    clock.advance(120.0)
    result = accrue_many(session, [(attempt.id, clock.now())], LOOKAHEAD, lease_seconds=lease)
    assert result.one_by_one == [attempt.id]
    lifecycle.accrue(session, attempt.id, clock.now(), LOOKAHEAD, lease_seconds=lease)
    assert job_reserved(session, job.id) > held - cost_micros(SPOT_PRICE, 120.0)
    # the top-up took a lease's worth more: the next renewals are the batch's again
    for _ in range(3):
        clock.advance(120.0)
        result = accrue_many(session, [(attempt.id, clock.now())], LOOKAHEAD, lease_seconds=lease)
        assert result.booked == [attempt.id]
