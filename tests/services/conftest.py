"""Fixtures for service tests: a session on the test database, admitted and running jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from broker.db.models import Attempt, Job
from broker.services import admission, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.teams import create_team
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen, job_spec


@pytest.fixture
def session(db_engine: Engine) -> Iterator[Session]:
    with Session(db_engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def submit(session: Session, clock: Any) -> Callable[..., Job]:
    """Admit a job (``job_spec(**overrides)``) for a new team with ``budget`` micro-dollars;
    its deadline, unless given, 48 h after the clock's now (``job_spec``'s own at START; a test
    that sets the clock to the wall's time, as moto's launch times need, keeps that margin)."""

    def _submit(budget: int = 1_000_000_000, **overrides: Any) -> Job:
        overrides.setdefault("deadline", (clock.now() + timedelta(hours=48)).isoformat())
        team = create_team(session, f"t{budget}", budget, "month", 0.8, clock.now())
        spec = JobSpec.model_validate(job_spec(**overrides))
        job, _ = admission.submit(session, team.id, spec, clock.now())
        return job

    return _submit


@pytest.fixture
def run_spot(session: Session, clock: Any) -> Callable[..., tuple[Attempt, str]]:
    """Begin and launch an attempt of a job on SPOT_PLAN (at ``price``); returns it and its
    agent token."""

    def _running(job: Job, price: int = SPOT_PRICE) -> tuple[Attempt, str]:
        begun = lifecycle.begin_attempt(session, job.id, chosen(SPOT_PLAN, price), clock.now())
        assert begun is not None
        attempt, token = begun
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        return attempt, token

    return _running
