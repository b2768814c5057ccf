"""What the end-to-end tests share: the embedded stack on the suite's backend, a team's view
of its API, and the checks that spend was booked exactly and no instance was left behind."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from broker.client import BrokerClient, Job, Quote
from broker.core.job_status import TERMINAL
from tests.helpers import drop_postgres, fresh_postgres, reachable

PG_BASE = os.environ.get("BROKER_TEST_DATABASE_URL")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
"""The folder the end-to-end jobs run in: ``train.py`` is their program."""
SCALE = 1200.0
CELERY_URLS = {
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672//", 5672),
    "redis": ("redis://127.0.0.1:6379/0", 6379),
}


@contextmanager
def backend_stack(
    folder: Path, celery: str = "rabbitmq", extra_env: dict[str, str] | None = None, **options: Any
) -> Iterator[tuple[Any, str | None]]:
    """The embedded stack at x1200 on the suite's backend; yields (stack, database URL).

    Without BROKER_TEST_DATABASE_URL: SQLite + the file-system transport. With it: a fresh
    PostgreSQL database, dropped afterwards, and ``celery`` ("rabbitmq", "redis", or
    "filesystem"), skipped when its server is not running.
    """
    from broker.devstack.stack import EmbeddedStack

    database_url = celery_url = created = None
    if PG_BASE:
        if celery in CELERY_URLS:
            celery_url, port = CELERY_URLS[celery]
            if not reachable(port):
                pytest.skip(f"{celery} is not running on 127.0.0.1:{port}")
        database_url, created = fresh_postgres(PG_BASE)
    stack = EmbeddedStack(
        folder,
        scale=SCALE,
        tick_seconds=1.0,
        reconcile_seconds=3.0,
        database_url=database_url,
        celery_broker_url=celery_url,
        extra_env={
            "BROKER_CELERY_QUEUE": f"broker-test-{secrets.token_hex(4)}",
            **(extra_env or {}),
        },
        **options,
    )
    try:
        with stack:
            yield stack, database_url
    finally:
        if created and PG_BASE:
            drop_postgres(PG_BASE, created)


class Api:
    """A team's view of the stack's API through ``BrokerClient`` (the admin creates the team
    and its key); ``client`` is the team's client."""

    def __init__(self, stack: Any, limit: str = "1000.00") -> None:
        self.stack = stack
        with BrokerClient(stack.api_url, stack.admin_token) as admin:
            self.team = admin.create_team(f"e2e-{secrets.token_hex(3)}", limit)
            self.key = admin.create_key(self.team["id"], "e2e")["token"]
        self.client = BrokerClient(stack.api_url, self.key)
        self._workdir: str | None = None

    def run(self, *flags: str) -> dict[str, str]:
        """A run block: ``python train.py`` (with ``flags``) in ``examples/``, uploaded once
        per team as its workdir."""
        if self._workdir is None:
            self._workdir = self.client.upload_workdir(EXAMPLES)
        return {"command": " ".join(["python train.py", *flags]), "workdir": self._workdir}

    def close(self) -> None:
        self.client.close()

    def spec(self, hours: float = 2.0, deadline_hours: float = 10.0, **extra: Any) -> dict:
        from broker import clock

        spec = {
            "name": f"job-{secrets.token_hex(3)}",
            "workload": {"reference_gpu_hours": hours},
            "resources": {"gpus": 1, "gpu_types": ["V100"]},
            "deadline": (clock.now() + timedelta(hours=deadline_hours)).isoformat(),
            "max_cost": "60.00",
            "checkpoint": {"interval_minutes": 30, "size_gb": 5},
            "run": self.run(),
        }
        spec.update(extra)
        return spec

    def quote(self, spec: dict) -> Quote:
        return self.client.quote(spec)

    def submit(self, spec: dict) -> Job:
        return self.client.submit_job(spec)

    def job(self, job_id: str) -> Job:
        return self.client.get_job(job_id)

    def wait(self, job_id: str, until: Callable[[Job], bool], timeout: float = 120.0) -> Job:
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while not until(job):
            assert self.stack.worker_alive(), "the Celery worker died; see worker.log"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out; job is {job['status']} ({job['status_reason']}), "
                    f"progress {job['progress']}"
                )
            time.sleep(0.3)
            job = self.job(job_id)
        return job

    def finish(self, job_id: str, timeout: float = 120.0) -> Job:
        return self.wait(job_id, lambda j: j["status"] in TERMINAL, timeout)


def assert_ledger_matches_attempts(job_id: str) -> list[Any]:
    """Spend booked for the job == sum over attempts of billed seconds x price, exactly, and
    nothing left reserved; returns the job's attempts."""
    from broker.core.money import cost_micros
    from broker.db.engine import get_engine
    from broker.db.models import Attempt
    from broker.services.ledger import job_reserved, job_spent

    with Session(get_engine()) as session:
        attempts = list(session.exec(select(Attempt).where(Attempt.job_id == job_id)).all())
        for attempt in attempts:
            assert attempt.status == "ended"
            assert attempt.cost_micros == cost_micros(
                attempt.price_micros_per_hour, attempt.billed_seconds
            )
        assert job_spent(session, job_id) == sum(a.cost_micros for a in attempts)
        assert job_reserved(session, job_id) == 0
    return attempts


def assert_no_instance_left(stack: Any, timeout: float = 20.0) -> None:
    """No broker instance left running once reconcile (every 3 s) had ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := stack.running_instances()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []
