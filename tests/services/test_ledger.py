"""The ledger's budget check: what fits is held, what does not is refused and leaves nothing,
and a check that waited for the team row reads what the previous holder committed."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from broker.core.errors import BudgetExceeded, NotFound
from broker.db.models import Job, LedgerEntry, Team
from broker.services import ledger
from broker.services.teams import create_team


def _job(session: Session, team: Team, clock: Any, name: str) -> Job:
    """A bare job row of ``team``, flushed (what admission has inserted before the lock)."""
    now = clock.now()
    job = Job(
        id=f"job_{name}_{team.id[-8:]}",
        team_id=team.id,
        name=name,
        status="queued",
        spec={},
        market="auto",
        total_work=1.0,
        deadline=now + timedelta(days=1),
        max_cost_micros=10_000_000,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    session.flush()
    return job


def _entries(session: Session, team: Team) -> int:
    query = select(func.count()).select_from(LedgerEntry).where(LedgerEntry.team_id == team.id)
    return session.exec(query).one()


def test_what_fits_exactly_is_held_and_one_micro_more_is_refused_leaving_nothing(session, clock):
    team = create_team(session, "edge", 1_000_000, "total", 0.8, clock.now())
    first = _job(session, team, clock, "a")
    ledger.lock_and_reserve(session, team.id, first.id, 600_000, clock.now())
    session.commit()
    second = _job(session, team, clock, "b")
    with pytest.raises(BudgetExceeded, match="has 0.40 USD available, this job needs 0.400001 USD"):
        ledger.lock_and_reserve(session, team.id, second.id, 400_001, clock.now())
    session.rollback()
    assert _entries(session, team) == 1
    third = _job(session, team, clock, "c")
    ledger.lock_and_reserve(session, team.id, third.id, 400_000, clock.now())
    session.commit()
    assert ledger.team_budget(session, team, clock.now()).available == 0
    assert ledger.job_reserved(session, third.id) == 400_000


@pytest.mark.parametrize(("period", "fits"), [("month", True), ("total", False)])
def test_last_months_spend_counts_for_a_total_budget_only(session, clock, period, fits):
    team = create_team(session, f"p-{period}", 1_000_000, period, 0.8, clock.now())
    old = _job(session, team, clock, "old")
    session.add(
        LedgerEntry(
            team_id=team.id,
            job_id=old.id,
            kind=ledger.SPEND,
            amount_micros=900_000,
            created_at=clock.now() - timedelta(days=40),
        )
    )
    session.commit()
    new = _job(session, team, clock, "new")
    if fits:
        ledger.lock_and_reserve(session, team.id, new.id, 500_000, clock.now())
        session.commit()
        assert ledger.job_reserved(session, new.id) == 500_000
    else:
        with pytest.raises(BudgetExceeded):
            ledger.lock_and_reserve(session, team.id, new.id, 500_000, clock.now())
        session.rollback()


def test_an_unknown_team_is_not_found(session, clock):
    with pytest.raises(NotFound):
        ledger.lock_and_reserve(session, "team_nope", "job_nope", 1, clock.now())
    session.rollback()


def test_a_check_that_waited_for_the_team_row_sees_the_reservation_committed_before_it(
    db_engine: Engine, session, clock
):
    team = create_team(session, "waits", 1_000_000, "total", 0.8, clock.now())
    first, second = _job(session, team, clock, "a"), _job(session, team, clock, "b")
    session.commit()
    ledger.lock_and_reserve(session, team.id, first.id, 700_000, clock.now())  # holds the row
    outcome: list[BaseException | None] = []
    started = threading.Event()

    def other() -> None:
        with Session(db_engine, expire_on_commit=False) as mine:
            started.set()
            try:
                ledger.lock_and_reserve(mine, team.id, second.id, 700_000, clock.now())
                mine.commit()
                outcome.append(None)
            except BudgetExceeded as error:
                mine.rollback()
                outcome.append(error)

    thread = threading.Thread(target=other)
    thread.start()
    started.wait()
    thread.join(timeout=0.5)
    assert thread.is_alive()  # it waits for the row (PostgreSQL) or the write lock (SQLite)
    session.commit()
    thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], BudgetExceeded)
    assert "has 0.30 USD available" in str(outcome[0])
    assert ledger.team_budget(session, team, clock.now()).reserved == 700_000
