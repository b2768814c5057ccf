"""The money ledger: reservations, their release, and spend, per team and per job.

A team's available budget is ``limit - spent - reserved``, where ``spent`` counts the current
period's spend and ``reserved`` what is still held for unfinished jobs. Every function here
runs inside the caller's transaction; the caller locks the team row first (``lock_team``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from broker.core.errors import BudgetExceeded, InvalidInput, NotFound
from broker.core.money import format_usd
from broker.db.engine import begin_write, is_postgres
from broker.db.models import Attempt, Job, LedgerEntry, Team

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


def lock_team(session: Session, team_id: str) -> Team:
    """Load the team row and hold it for this transaction (FOR UPDATE on PostgreSQL).

    On SQLite the transaction becomes a write transaction that holds the database lock.
    """
    begin_write(session)
    statement = select(Team).where(Team.id == team_id)
    if is_postgres(session):
        statement = statement.with_for_update()
    team = session.exec(statement).first()
    if team is None:
        raise NotFound(f"team {team_id} not found")
    return team


def _signed_reserved() -> object:
    return func.coalesce(
        func.sum(
            case(
                (LedgerEntry.kind == RESERVE, LedgerEntry.amount_micros),
                (LedgerEntry.kind == RELEASE, -LedgerEntry.amount_micros),
                else_=0,
            )
        ),
        0,
    )


def team_budget(session: Session, team: Team, now: datetime) -> BudgetFigures:
    """Limit, period spend and outstanding reservations of ``team`` at ``now`` (one query)."""
    start = period_start(team.budget_period, now)
    in_period = col(LedgerEntry.kind).in_(SPENT_KINDS)
    if start is not None:
        in_period = in_period & (LedgerEntry.created_at >= start)
    spent = func.coalesce(func.sum(case((in_period, LedgerEntry.amount_micros), else_=0)), 0)
    spent_micros, reserved_micros = session.exec(
        select(spent, _signed_reserved()).where(LedgerEntry.team_id == team.id)
    ).one()
    return BudgetFigures(
        limit=team.budget_limit_micros,
        period=team.budget_period,
        period_start=start,
        spent=int(spent_micros),
        reserved=int(reserved_micros),
        alert_at=team.alert_at,
    )


def job_reserved(session: Session, job_id: str) -> int:
    """What is still reserved for a job."""
    query = select(_signed_reserved()).where(
        LedgerEntry.job_id == job_id, LedgerEntry.kind.in_((RESERVE, RELEASE))
    )
    return int(session.exec(query).one())


def job_spent(session: Session, job_id: str) -> int:
    """Everything booked as spend for a job."""
    query = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
        LedgerEntry.job_id == job_id, col(LedgerEntry.kind).in_(SPENT_KINDS)
    )
    return int(session.exec(query).one())


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


def reserve(session: Session, team: Team, job: Job, amount: int, now: datetime) -> None:
    """Hold ``amount`` of the (locked) team's budget for ``job``, or raise BudgetExceeded."""
    if amount < 0:
        raise ValueError("a reservation cannot be negative")
    figures = team_budget(session, team, now)
    if amount > figures.available:
        raise BudgetExceeded(
            f"team {team.name} has {format_usd(max(figures.available, 0))} USD available, "
            f"this job needs {format_usd(amount)} USD"
        )
    session.add(_entry(team.id, job.id, None, RESERVE, amount, now))


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
        LedgerEntry.team_id == team_id, col(LedgerEntry.kind).in_(SPENT_KINDS)
    )
    if group_by == "provider":
        query = query.join(Attempt, Attempt.id == LedgerEntry.attempt_id, isouter=True)
    if start is not None:
        query = query.where(LedgerEntry.created_at >= start)
    if end is not None:
        query = query.where(LedgerEntry.created_at < end)
    rows = session.exec(query.group_by(key).order_by(key)).all()
    return [(str(k) if k is not None else "none", int(v)) for k, v in rows]
