"""Book a batch of running attempts' spend and renew their leases in one transaction.

The control loop's common case, for many attempts at once: each attempt is billed to the time
its instance was observed and its lease renewed out of what its job already holds reserved,
exactly as ``lifecycle.accrue`` would (the amounts come from ``broker.core.accrual``, which
``billing`` uses too). The batch locks its jobs (in id order, so two batches never wait on
each other in a cycle), reads every job's reserved and spent money in one query, writes the
ledger entries in one statement, and commits once.

An attempt whose accrual is not the common case is left for ``lifecycle.accrue`` to handle on
its own: a lease that lapsed, time past the lease (an overrun), a lease that needs the job's
reservation topped up from its team (that locks the team), or money that does not cover the
lookahead (the job stops). Nothing is written for those here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    String,
    bindparam,
    case,
    func,
    insert,
    or_,
    update,
)
from sqlalchemy import select as core_select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, col, select

from broker.core import accrual
from broker.core.job_status import is_terminal
from broker.db.engine import begin_write, is_postgres, one_of
from broker.db.models import Attempt, Job, LedgerEntry
from broker.services.billing import minimum_seconds, warn_if_alert_crossed
from broker.services.ledger import RELEASE, RESERVE, SPEND, SPENT_KINDS

RUNNING = "running"
LIVE = ("launching", RUNNING)

_LEDGER = LedgerEntry.__table__  # type: ignore[attr-defined]
_AMOUNT = _LEDGER.c.amount_micros
_SUMS = (  # each job's reserved and spent money, for the jobs ``where`` selects
    core_select(
        _LEDGER.c.job_id,
        func.coalesce(
            func.sum(
                case(
                    (_LEDGER.c.kind == RESERVE, _AMOUNT),
                    (_LEDGER.c.kind == RELEASE, -_AMOUNT),
                    else_=0,
                )
            ),
            0,
        ),
        func.coalesce(
            func.sum(
                case((or_(*(_LEDGER.c.kind == kind for kind in SPENT_KINDS)), _AMOUNT), else_=0)
            ),
            0,
        ),
    ).group_by(_LEDGER.c.job_id)
)
_INSERT = insert(_LEDGER)
_ATTEMPT = Attempt.__table__  # type: ignore[attr-defined]
_RENEW = (
    update(_ATTEMPT)
    .where(_ATTEMPT.c.id == bindparam("attempt_id"))
    .values(
        billed_seconds=bindparam("billed"),
        cost_micros=bindparam("cost"),
        lease_until=bindparam("until"),
    )
)
# PostgreSQL: the batch's renewals and ledger rows as one statement each, from arrays
# (``unnest``), instead of a statement a row: a tenth of the client's CPU.
_RENEWED = (
    func.unnest(
        bindparam("attempt_id", type_=ARRAY(String)),
        bindparam("billed", type_=ARRAY(Float)),
        bindparam("cost", type_=ARRAY(BigInteger)),
        bindparam("until", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued("attempt_id", "billed", "cost", "until")
    .render_derived(name="renewed")
)
_RENEW_PG = (
    update(_ATTEMPT)
    .where(_ATTEMPT.c.id == _RENEWED.c.attempt_id)
    .values(
        billed_seconds=_RENEWED.c.billed,
        cost_micros=_RENEWED.c.cost,
        lease_until=_RENEWED.c.until,
    )
)
_ENTRY_COLUMNS = ("team_id", "job_id", "attempt_id", "kind", "amount_micros", "created_at")
_ENTRIES = (
    func.unnest(
        *(
            bindparam(name, type_=ARRAY(String))
            for name in ("team_id", "job_id", "attempt_id", "kind")
        ),
        bindparam("amount_micros", type_=ARRAY(BigInteger)),
        bindparam("created_at", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued(*_ENTRY_COLUMNS)
    .render_derived(name="entries")
)
_INSERT_PG = insert(_LEDGER).from_select(
    list(_ENTRY_COLUMNS), core_select(*(_ENTRIES.c[name] for name in _ENTRY_COLUMNS))
)


@dataclass
class Accrued:
    """What a batch did: the attempts booked and renewed here, those left for
    ``lifecycle.accrue`` (or the caller) one by one, and those with nothing to do (no longer
    running); the booked attempts and their jobs as read under the batch's lock."""

    booked: list[str] = field(default_factory=list)
    one_by_one: list[str] = field(default_factory=list)
    idle: list[str] = field(default_factory=list)
    attempts: dict[str, Attempt] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)


def accrue_many(
    session: Session,
    observed: Sequence[tuple[str, datetime]],
    lookahead_seconds: float,
    *,
    lease_seconds: float,
    ready: Callable[[Attempt], bool] | None = None,
) -> Accrued:
    """Book each ``(attempt id, observed at)`` to its time and renew its lease within its
    job's reservation, all in one transaction; see the module doc for what is left out.
    ``ready``: a further test of each live attempt as read under the lock (the control
    loop's: instance up, agent heard); one that fails it is left one by one, unbooked."""
    result = Accrued()
    if not observed:
        return result
    ids = [attempt_id for attempt_id, _ in observed]
    begin_write(session)
    postgres = is_postgres(session)
    # the batch's jobs, found through their attempts in the same statement (an attempt's job
    # never changes, so the subquery's snapshot cannot be stale)
    of_batch = select(Attempt.job_id).where(one_of(session, Attempt.id, ids))
    lock = select(Job).where(col(Job.id).in_(of_batch)).order_by(col(Job.id))
    if postgres:
        lock = lock.with_for_update()
    options: dict[str, Any] = {"populate_existing": True}
    jobs = {job.id: job for job in session.exec(lock, execution_options=options).all()}
    job_ids = list(jobs)
    attempts = {
        attempt.id: attempt
        for attempt in session.exec(
            select(Attempt).where(one_of(session, Attempt.id, ids)), execution_options=options
        ).all()
    }
    sums = {
        job_id: (int(reserved), int(spent))
        for job_id, reserved, spent in session.execute(
            _SUMS.where(one_of(session, _LEDGER.c.job_id, job_ids))
        ).all()
    }
    horizon = max(lease_seconds, lookahead_seconds)
    rows: list[dict[str, Any]] = []
    renewals: list[dict[str, Any]] = []
    booked_by_team: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for attempt_id, now in observed:
        attempt = attempts.get(attempt_id)
        job = jobs.get(attempt.job_id) if attempt is not None else None
        if attempt is None or job is None or attempt.status not in LIVE or is_terminal(job.status):
            result.idle.append(attempt_id)
            continue
        if attempt.status != RUNNING or (ready is not None and not ready(attempt)):
            result.one_by_one.append(attempt_id)
            continue
        held, spent = sums.get(job.id, (0, 0))
        step = _common_case(attempt, job, held, spent, now, lookahead_seconds, horizon)
        if step is None or job.id in seen:
            result.one_by_one.append(attempt_id)
            continue
        seen.add(job.id)
        bill, lease_until = step
        # one statement below, not the unit of work's flush; the objects show what it wrote
        renewals.append(
            {
                "attempt_id": attempt.id,
                "billed": bill.billed_seconds,
                "cost": bill.cost_micros,
                "until": lease_until,
            }
        )
        set_committed_value(attempt, "billed_seconds", bill.billed_seconds)
        set_committed_value(attempt, "cost_micros", bill.cost_micros)
        set_committed_value(attempt, "lease_until", lease_until)
        if bill.spend:
            entry = {"team_id": job.team_id, "job_id": job.id, "created_at": now}
            rows.append({**entry, "attempt_id": attempt.id, "kind": SPEND})
            rows[-1]["amount_micros"] = bill.spend
            release = min(bill.spend, held)
            if release > 0:
                rows.append({**entry, "attempt_id": None, "kind": RELEASE})
                rows[-1]["amount_micros"] = release
            booked_by_team[job.team_id] += bill.spend
        result.booked.append(attempt_id)
        result.attempts[attempt_id] = attempt
        result.jobs[job.id] = job
    if renewals and postgres:
        session.execute(_RENEW_PG, _columns(renewals))
    elif renewals:
        session.execute(_RENEW, renewals)
    if rows and postgres:
        session.execute(_INSERT_PG, _columns(rows))
    elif rows:
        session.execute(_INSERT, rows)
    at = max(now for _, now in observed)
    for team_id, booked in booked_by_team.items():
        warn_if_alert_crossed(session, team_id, booked, at)
    session.commit()
    return result


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows of one shape as one list per key, for an ``unnest`` statement."""
    return {key: [row[key] for row in rows] for key in rows[0]}


def _common_case(
    attempt: Attempt,
    job: Job,
    held: int,
    spent: int,
    now: datetime,
    lookahead_seconds: float,
    horizon_seconds: float,
) -> tuple[accrual.Booking, datetime] | None:
    """The booking and the lease's new end, when this accrual is the common case (module
    doc); None when ``lifecycle.accrue`` must do it."""
    if attempt.started_at is None:
        return None
    if attempt.lease_until is not None and now > attempt.lease_until:
        return None  # lapsed: the attempt ends
    minimum = minimum_seconds(attempt)
    price = attempt.price_micros_per_hour
    bill = accrual.booking(
        price,
        attempt.started_at,
        minimum,
        attempt.billed_seconds,
        attempt.cost_micros,
        attempt.lease_until,
        now,
    )
    if bill.overrun:
        return None
    held_after = held - min(bill.spend, max(held, 0))
    left_after = job.max_cost_micros - spent - bill.spend
    need = accrual.lease_need(
        price, attempt.started_at, minimum, bill.cost_micros, now, horizon_seconds
    )
    if need > held_after and left_after > held_after:
        return None  # the reservation must be topped up from the team's budget
    lease_until = accrual.lease_end(
        price,
        attempt.started_at,
        bill.cost_micros,
        min(need, held_after, left_after),
        attempt.lease_until,
        now,
        horizon_seconds,
    )
    if (lease_until - now).total_seconds() < lookahead_seconds:
        return None  # the money does not cover the next check: the job stops
    return bill, lease_until
