"""``GET /healthz``: the database answers, the broker's clock, and the liveness of a real Celery
worker and beat (on kombu's file-system transport), which the API learns by asking them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.settings import get_settings

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT = 0.5
TIMEOUT = 3.0


@pytest.fixture
def quick_liveness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Settings of a fast heartbeat and a short timeout, on a Celery transport of the test's
    own; yields the environment a worker needs to join it."""
    env = {
        "BROKER_DATA_DIR": str(tmp_path),
        "BROKER_CELERY_QUEUE": f"health-{os.getpid()}",
        "BROKER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "BROKER_LIVENESS_TIMEOUT_SECONDS": str(TIMEOUT),
        # Beat sends only heartbeats during the test.
        "BROKER_TICK_SECONDS": "3600",
        "BROKER_RECONCILE_SECONDS": "3600",
        "BROKER_REFRESH_PRICES_SECONDS": "3600",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()


@contextlib.contextmanager
def worker(folder: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A tasks worker --beat`` in its own process group; killed afterwards."""
    log = open(folder / "worker.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "tasks", "worker", "--beat",
            "--schedule", str(folder / "celerybeat-schedule"), "--concurrency", "1",
            "--loglevel", "info", "--without-gossip", "--without-mingle",
        ],
        env=dict(os.environ),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        log.close()


def wait_for(client: Any, until: Any, timeout: float, log: Path) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/healthz")
        assert response.status_code == 200
        body = response.json()
        if until(body):
            return body
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"healthz stayed {body}; worker log:\n{tail}")
        time.sleep(0.2)


def test_healthz_reports_the_broker_clock_and_degraded_without_workers(
    client, clock, quick_liveness
) -> None:  # type: ignore[no-untyped-def]
    clock.advance(timedelta(hours=5).total_seconds())
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert datetime.fromisoformat(body["time"]) == clock.now()
    assert body["status"] == "degraded"
    assert body["workers"] == {"alive": 0, "last_seen": None, "silent_seconds": None}
    assert body["beat"] == {"alive": False, "last_seen": None, "silent_seconds": None}
    assert body["timeout_seconds"] == TIMEOUT


def test_healthz_sees_a_worker_and_beat_and_notices_when_they_die(
    client, tmp_path, quick_liveness
) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "worker.log"
    with worker(tmp_path) as process:
        body = wait_for(client, lambda b: b["status"] == "ok", 60, log)
        assert body["workers"]["alive"] == 1
        assert body["beat"]["alive"] is True
        assert body["beat"]["silent_seconds"] <= TIMEOUT
        assert datetime.fromisoformat(body["beat"]["last_seen"]) <= datetime.fromisoformat(
            body["time"]
        )
        # Fast: answered from the monitor's last view, never from a probe of its own.
        started = time.monotonic()
        for _ in range(5):
            client.get("/healthz")
        assert (time.monotonic() - started) / 5 < 0.25
        # Nothing that names a host or a secret.
        text = client.get("/healthz").text
        assert "@" not in text and os.uname().nodename not in text
        assert "adm_" not in text and "brk_" not in text

        os.killpg(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(client, lambda b: b["status"] == "degraded", TIMEOUT + 10, log)
        degraded_after = time.monotonic() - killed
        body = wait_for(client, lambda b: b["workers"]["alive"] == 0, TIMEOUT + 10, log)
    assert degraded_after <= TIMEOUT + 8, degraded_after  # the timeout, and a probe or two
    assert body["status"] == "degraded"
    assert body["beat"]["alive"] is False
    assert body["workers"]["silent_seconds"] >= TIMEOUT  # rounded to 0.1 s
    assert body["beat"]["silent_seconds"] >= TIMEOUT


def test_healthz_and_metrics_say_the_loop_is_behind_when_a_lease_lapsed(
    client, clock, quick_liveness, db_engine, admin_headers
) -> None:  # type: ignore[no-untyped-def]
    from sqlmodel import Session

    from broker.services import admission, lifecycle
    from broker.services.job_spec import JobSpec
    from broker.services.teams import create_team
    from tests.helpers import SPOT_PLAN, SPOT_PRICE, chosen, job_spec

    assert client.get("/healthz").json()["loop"] == {
        "behind": False,
        "lapsed_leases": 0,
        "late_seconds": 0.0,
    }
    with Session(db_engine, expire_on_commit=False) as session:
        team = create_team(session, "late", 10**9, "month", 0.8, clock.now())
        job, _ = admission.submit(session, team.id, JobSpec.model_validate(job_spec()), clock.now())
        attempt, _ = lifecycle.begin_attempt(
            session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
        )
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=600)
    clock.advance(900)  # nobody renewed the lease: it ended 300 s ago
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["loop"] == {"behind": True, "lapsed_leases": 1, "late_seconds": 300.0}
    metrics = client.get("/metrics", headers=admin_headers).text
    assert "broker_leases_lapsed 1.0" in metrics
    assert "broker_loop_late_seconds 300.0" in metrics
