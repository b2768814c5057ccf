"""Jobs finish through cloud faults and database trouble, with spend booked and no orphan.

- Cloud faults: both local clouds answer 20 % of calls with throttling, 5xx or delays.
- Database trouble (PostgreSQL only): every connection of the workers and the API is killed
  with ``pg_terminate_backend`` several times while jobs run.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from broker.client import BrokerApiError, BrokerUnreachable
from broker.core.job_status import TERMINAL
from tests.e2e.support import (
    PG_BASE,
    Api,
    assert_ledger_matches_attempts,
    assert_no_instance_left,
    backend_stack,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _run_jobs(
    stack: Any, count: int, timeout: float = 180.0, tolerate_5xx: bool = False
) -> list[dict]:
    """Submit ``count`` jobs (AWS and GCP) and wait until every one has finished.

    ``tolerate_5xx``: a read whose connection is killed under it may fail; poll again.
    """
    from broker import clock

    api = Api(stack, limit="900.00")
    ids = []
    for i in range(count):
        spec = {
            "name": f"trouble-{i}",
            "workload": {"reference_gpu_hours": 1.0 + 0.25 * i},
            "resources": {"gpus": 1, "providers": ["aws" if i % 2 else "gcp"]},
            "deadline": (clock.now() + timedelta(hours=14)).isoformat(),
            "max_cost": "80.00",
            "run": api.run(),
        }
        ids.append(api.submit(spec)["id"])
    deadline = time.monotonic() + timeout
    while True:
        jobs: list[dict] = []
        for job_id in ids:
            try:
                jobs.append(dict(api.client.get_job(job_id)))
            except BrokerUnreachable:  # a dropped keep-alive connection: poll again
                jobs.append({"status": "unknown"})
            except BrokerApiError as error:
                if not (tolerate_5xx and (error.status or 0) >= 500):
                    raise
                jobs.append({"status": "unknown"})
        if all(j["status"] in TERMINAL for j in jobs):
            return jobs
        assert stack.worker_alive(), "the worker died; see worker.log"
        assert time.monotonic() < deadline, [j["status"] for j in jobs]
        time.sleep(0.5)


def _assert_settled(stack: Any, jobs: list[dict]) -> None:
    """Spend booked exactly, nothing reserved, and no instance left after a reconcile."""
    for job in jobs:
        assert_ledger_matches_attempts(job["id"])
    assert_no_instance_left(stack, timeout=30.0)


def test_jobs_finish_when_a_fifth_of_cloud_calls_fail(tmp_path: Path) -> None:
    with backend_stack(tmp_path / "faults", fault_rate=0.2) as (stack, _url):
        jobs = _run_jobs(stack, 4)
        assert all(j["status"] == "succeeded" for j in jobs), [j["status_reason"] for j in jobs]
        # Cloud calls of the broker and the agents' presigned checkpoint transfers alike.
        assert stack.cloud.faults.total_injected >= 10
        stack.cloud.faults.rate = 0.0  # so the orphan check itself is not refused
        _assert_settled(stack, jobs)


@pytest.mark.skipif(not PG_BASE, reason="kills PostgreSQL backends; needs BROKER_TEST_DATABASE_URL")
def test_jobs_finish_when_database_connections_are_killed(tmp_path: Path) -> None:
    with backend_stack(tmp_path / "pg-kill") as (stack, url):
        assert url is not None
        name = make_url(url).database
        admin = create_engine(PG_BASE or "", isolation_level="AUTOCOMMIT")
        killed: list[int] = []
        stop = threading.Event()

        def kill_backends() -> None:
            while not stop.wait(2.0):
                with admin.connect() as connection:
                    rows = connection.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    ).all()
                killed.append(len(rows))

        killer = threading.Thread(target=kill_backends, daemon=True)
        killer.start()
        try:
            jobs = _run_jobs(stack, 3, tolerate_5xx=True)
        finally:
            stop.set()
            killer.join(timeout=10)
            admin.dispose()
        assert sum(killed) > 5, killed
        assert all(j["status"] == "succeeded" for j in jobs), [j["status_reason"] for j in jobs]
        _assert_settled(stack, jobs)
