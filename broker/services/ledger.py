"""The money ledger: reservations, their release, and spend, per team and per job.

A team's available budget is ``limit - spent - reserved``, where ``spent`` counts the current
period's spend and ``reserved`` what is still held for unfinished jobs. Every function here
runs inside the caller's transaction; the caller locks the team row first (``lock_team``).

The figures are read with statements built once at import (Core, on the table's columns):
they run on every submission and every tick, and building or ORM-loading them each time
was most of their cost. They flush the session first, as an ORM query would.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Select, and_, bindparam, case, func, insert, literal, or_, select
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col

from broker.core.errors import BudgetExceeded, InvalidInput, NotFound
from broker.core.money import format_usd
from broker.db.engine import begin_write, is_postgres
from broker.db.models import Attempt, Job, LedgerEntry, Team, UTCDateTime

RESERVE, RELEASE, SPEND = "reserve", "release", "spend"
# Spend past an attempt's lease: real money the broker did not grant (an instance that ran
# on after its lease lapsed); counted as spend everywhere, and alerted on.
OVERRUN = "overrun"
SPENT_KINDS = (SPEND, OVERRUN)


@dataclass(frozen=True)
class BudgetFigures:
    """A team's budget for its current period, in micro-dollars."""

    limit: int
    period: str
    period_start: datetime | None
    spent: int
    reserved: int
    alert_at: float

    @property
    def available(self) -> int:
        return self.limit - self.spent - self.reserved

    @property
    def alert(self) -> bool:
        """True once spend in the period reaches the team's alert threshold."""
        return self.spent >= self.alert_at * self.limit


def period_start(period: str, now: datetime) -> datetime | None:
    """Start of the budget period containing ``now`` (None for a "total" budget)."""
    if period == "total":
        return None
    return datetime(now.year, now.month, 1, tzinfo=UTC)


_LEDGER = LedgerEntry.__table__  # type: ignore[attr-defined]
_TEAM = Team.__table__  # type: ignore[attr-defined]
_AMOUNT = _LEDGER.c.amount_micros

# Row locks on the team are FOR NO KEY UPDATE: they exclude each other (one budget check at a
# time per team) but not the KEY SHARE lock that inserting a row referencing the team takes,
# so jobs and ledger entries of the team are inserted while a check holds the row.
_LOCK_TEAM = select(Team).where(Team.id == bindparam("team_id"))
_LOCK_TEAM_PG = _LOCK_TEAM.with_for_update(key_share=True)


def lock_team(session: Session, team_id: str) -> Team:
    """Load the team row and hold it for this transaction (FOR NO KEY UPDATE on PostgreSQL).

    On SQLite the transaction becomes a write transaction that holds the database lock.
    """
    begin_write(session)
    statement = _LOCK_TEAM_PG if is_postgres(session) else _LOCK_TEAM
    team = session.execute(
        statement, {"team_id": team_id}, execution_options={"populate_existing": True}
    ).scalar()
    if team is None:
        raise NotFound(f"team {team_id} not found")
    return team


def _signed_reserved() -> ColumnElement[Any]:
    return func.coalesce(
        func.sum(
            case(
                (_LEDGER.c.kind == RESERVE, _AMOUNT),
                (_LEDGER.c.kind == RELEASE, -_AMOUNT),
                else_=0,
            )
        ),
        0,
    )


def _spent_in_period(since_start: bool) -> ColumnElement[Any]:
    spent: ColumnElement[bool] = or_(*(_LEDGER.c.kind == kind for kind in SPENT_KINDS))
    if since_start:
        start = bindparam("start", type_=UTCDateTime())
        spent = and_(spent, _LEDGER.c.created_at >= start)
    return func.coalesce(func.sum(case((spent, _AMOUNT), else_=0)), 0)


def _team_sums(since_start: bool) -> Select[Any]:
    return select(_spent_in_period(since_start), _signed_reserved()).where(
        _LEDGER.c.team_id == bindparam("team_id")
    )


# Keyed by "the budget has a period start" (False: a "total" budget).
_TEAM_SUMS = {since: _team_sums(since) for since in (False, True)}


def _reserve_if_fits(since_start: bool) -> Any:
    """INSERT a reserve entry only when it fits in the team's budget, in one statement (the
    check reads the ledger as of this statement: run it after the team row is locked)."""
    limit = bindparam("limit", type_=_AMOUNT.type)
    available = (
        select(limit - _spent_in_period(since_start) - _signed_reserved())
        .where(_LEDGER.c.team_id == bindparam("team_id"))
        .scalar_subquery()
    )
    amount = bindparam("amount", type_=_AMOUNT.type)
    row = select(
        bindparam("team_id", type_=_LEDGER.c.team_id.type),
        bindparam("job_id", type_=_LEDGER.c.job_id.type),
        literal(RESERVE, type_=_LEDGER.c.kind.type),
        amount,
        bindparam("now", type_=UTCDateTime()),
    ).where(amount <= available)
    columns = ["team_id", "job_id", "kind", "amount_micros", "created_at"]
    return insert(_LEDGER).from_select(columns, row).returning(_LEDGER.c.id)


_RESERVE_IF_FITS = {since: _reserve_if_fits(since) for since in (False, True)}

_LOCK_FOR_ADMISSION = select(
    _TEAM.c.name, _TEAM.c.budget_limit_micros, _TEAM.c.budget_period
).where(_TEAM.c.id == bindparam("team_id"))
_LOCK_FOR_ADMISSION_PG = _LOCK_FOR_ADMISSION.with_for_update(key_share=True)

_JOB_RESERVED = select(_signed_reserved()).where(
    _LEDGER.c.job_id == bindparam("job_id"),
    or_(_LEDGER.c.kind == RESERVE, _LEDGER.c.kind == RELEASE),
)
_JOB_SPENT = select(func.coalesce(func.sum(_AMOUNT), 0)).where(
    _LEDGER.c.job_id == bindparam("job_id"),
    or_(*(_LEDGER.c.kind == kind for kind in SPENT_KINDS)),
)


def _read(session: Session, statement: Any, params: dict[str, Any]) -> Any:
    """Run a prebuilt Core statement in the session's transaction, after an autoflush."""
    if session.autoflush:
        session.flush()
    return session.execute(statement, params)


def _figures(
    session: Session, team_id: str, limit: int, period: str, alert_at: float, now: datetime
) -> BudgetFigures:
    start = period_start(period, now)
    params: dict[str, Any] = {"team_id": team_id, "start": start}
    spent, reserved = _read(session, _TEAM_SUMS[start is not None], params).one()
    return BudgetFigures(
        limit=limit,
        period=period,
        period_start=start,
        spent=int(spent),
        reserved=int(reserved),
        alert_at=alert_at,
    )


def team_budget(session: Session, team: Team, now: datetime) -> BudgetFigures:
    """Limit, period spend and outstanding reservations of ``team`` at ``now`` (one query)."""
    return _figures(
        session, team.id, team.budget_limit_micros, team.budget_period, team.alert_at, now
    )


def job_reserved(session: Session, job_id: str) -> int:
    """What is still reserved for a job."""
    return int(_read(session, _JOB_RESERVED, {"job_id": job_id}).scalar_one())


def job_spent(session: Session, job_id: str) -> int:
    """Everything booked as spend for a job."""
    return int(_read(session, _JOB_SPENT, {"job_id": job_id}).scalar_one())


def _entry(
    team_id: str, job_id: str | None, attempt_id: str | None, kind: str, amount: int, now: datetime
) -> LedgerEntry:
    return LedgerEntry(
        team_id=team_id,
        job_id=job_id,
        attempt_id=attempt_id,
        kind=kind,
        amount_micros=amount,
        created_at=now,
    )


def _reserve(
    session: Session,
    team_id: str,
    team_name: str,
    limit: int,
    period: str,
    job_id: str,
    amount: int,
    now: datetime,
) -> None:
    """The reserve entry, inserted only if ``amount`` fits (one statement), else
    BudgetExceeded naming what is available."""
    if amount < 0:
        raise ValueError("a reservation cannot be negative")
    start = period_start(period, now)
    params = {
        "team_id": team_id,
        "job_id": job_id,
        "amount": amount,
        "now": now,
        "limit": limit,
        "start": start,
    }
    if _read(session, _RESERVE_IF_FITS[start is not None], params).first() is not None:
        return
    available = _figures(session, team_id, limit, period, 0.0, now).available
    raise BudgetExceeded(
        f"team {team_name} has {format_usd(max(available, 0))} USD available, "
        f"this job needs {format_usd(amount)} USD"
    )


def reserve(session: Session, team: Team, job: Job, amount: int, now: datetime) -> None:
    """Hold ``amount`` of the (locked) team's budget for ``job``, or raise BudgetExceeded."""
    _reserve(
        session,
        team.id,
        team.name,
        team.budget_limit_micros,
        team.budget_period,
        job.id,
        amount,
        now,
    )


def lock_and_reserve(
    session: Session, team_id: str, job_id: str, amount: int, now: datetime
) -> None:
    """Lock the team row, then hold ``amount`` of its budget for the job ``job_id`` (already
    flushed), or raise BudgetExceeded: admission's serial section, two statements.

    The reservation is checked by a statement of its own after the lock is granted, so
    that it reads what the previous holder of the lock committed (a statement that waited
    for a lock still reads the data as of its start).
    """
    begin_write(session)
    statement = _LOCK_FOR_ADMISSION_PG if is_postgres(session) else _LOCK_FOR_ADMISSION
    team = session.execute(statement, {"team_id": team_id}).first()
    if team is None:
        raise NotFound(f"team {team_id} not found")
    name, limit, period = team
    _reserve(session, team_id, name, limit, period, job_id, amount, now)


def release(session: Session, job: Job, now: datetime, amount: int | None = None) -> int:
    """Give back ``amount`` (default: all) of what is reserved for ``job``; returns the amount."""
    outstanding = job_reserved(session, job.id)
    amount = outstanding if amount is None else min(amount, outstanding)
    if amount > 0:
        session.add(_entry(job.team_id, job.id, None, RELEASE, amount, now))
    return max(amount, 0)


def book_spend(
    session: Session,
    job: Job,
    attempt: Attempt | None,
    amount: int,
    now: datetime,
    kind: str = SPEND,
) -> None:
    """Book ``amount`` as spent (``kind`` SPEND, or OVERRUN past a lease); the same amount
    stops being reserved (up to what is held)."""
    if amount <= 0:
        return
    session.add(_entry(job.team_id, job.id, attempt.id if attempt else None, kind, amount, now))
    session.flush()
    release(session, job, now, amount)


GroupBy = Literal["day", "job", "provider"]


def spend_report(
    session: Session, team_id: str, start: datetime | None, end: datetime | None, group_by: GroupBy
) -> list[tuple[str, int]]:
    """Spend of a team between ``start`` (inclusive) and ``end`` (exclusive), grouped."""
    if start and end and end <= start:
        raise InvalidInput("end must be after start", field="end", location="query")
    if group_by == "day":
        if is_postgres(session):
            key = func.to_char(func.timezone("UTC", LedgerEntry.created_at), "YYYY-MM-DD")
        else:
            key = func.strftime("%Y-%m-%d", LedgerEntry.created_at)
    elif group_by == "job":
        key = LedgerEntry.job_id
    else:
        key = Attempt.provider
    query = select(key, func.sum(LedgerEntry.amount_micros)).where(
        col(LedgerEntry.team_id) == team_id, col(LedgerEntry.kind).in_(SPENT_KINDS)
    )
    if group_by == "provider":
        query = query.join(Attempt, Attempt.id == LedgerEntry.attempt_id, isouter=True)
    if start is not None:
        query = query.where(LedgerEntry.created_at >= start)
    if end is not None:
        query = query.where(LedgerEntry.created_at < end)
    rows = session.execute(query.group_by(key).order_by(key)).all()
    return [(str(k) if k is not None else "none", int(v)) for k, v in rows]
