"""Jobs through the REST API, driven by a real Celery worker + beat, on the local clouds.

One stack per module: API (uvicorn) and Celery worker (with beat) as subprocesses, moto and
the GCE fake with market replay and simulated training agents in this process, a 1200x
scaled clock. Without BROKER_TEST_DATABASE_URL: SQLite + kombu's file-system transport (no
server). With it: PostgreSQL + RabbitMQ and PostgreSQL + Redis (skipped when absent).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from broker.jobs import TERMINAL
from tests.helpers import drop_postgres, fresh_postgres, reachable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCALE = 1200.0


PG_BASE = os.environ.get("BROKER_TEST_DATABASE_URL")
STACKS = ["postgres+rabbitmq", "postgres+redis"] if PG_BASE else ["sqlite+embedded"]


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from broker.localstack import EmbeddedStack

    kind = request.param
    database_url = celery_url = None
    created = None
    queue = f"broker-test-{secrets.token_hex(4)}"
    if kind != "sqlite+embedded":
        assert PG_BASE is not None
        if kind.endswith("rabbitmq"):
            if not reachable(5672):
                pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
            celery_url = "amqp://guest:guest@127.0.0.1:5672//"
        else:
            if not reachable(6379):
                pytest.skip("Redis is not running on 127.0.0.1:6379")
            celery_url = "redis://127.0.0.1:6379/0"
        database_url, created = fresh_postgres(PG_BASE)
    folder = tmp_path_factory.mktemp(kind.replace("+", "-"))
    stack = EmbeddedStack(
        folder,
        scale=SCALE,
        tick_seconds=1.0,
        reconcile_seconds=3.0,
        database_url=database_url,
        celery_broker_url=celery_url,
        extra_env={"BROKER_CELERY_QUEUE": queue},
    )
    with stack:
        yield stack
    if created:
        drop_postgres(PG_BASE, created)


class Api:
    """A team's view of the stack's API."""

    def __init__(self, stack: Any, limit: str = "1000.00") -> None:
        self.stack = stack
        self.http = httpx.Client(base_url=stack.api_url, timeout=30)
        admin = {"Authorization": f"Bearer {stack.admin_token}"}
        body = {
            "name": f"e2e-{secrets.token_hex(3)}",
            "budget": {"limit": limit, "period": "month"},
        }
        team = self.http.post("/v1/teams", json=body, headers=admin)
        assert team.status_code == 201, team.text
        self.team = team.json()
        key = self.http.post(
            f"/v1/teams/{self.team['id']}/keys", json={"name": "e2e"}, headers=admin
        )
        self.headers = {"Authorization": f"Bearer {key.json()['token']}"}

    def spec(self, hours: float = 2.0, deadline_hours: float = 10.0, **extra: Any) -> dict:
        from broker import clock

        spec = {
            "name": f"job-{secrets.token_hex(3)}",
            "workload": {"reference_gpu_hours": hours},
            "resources": {"gpus": 1, "gpu_types": ["V100"]},
            "deadline": (clock.now() + timedelta(hours=deadline_hours)).isoformat(),
            "max_cost": "60.00",
            "checkpoint": {"interval_minutes": 30, "size_gb": 5},
        }
        spec.update(extra)
        return spec

    def quote(self, spec: dict) -> dict:
        response = self.http.post("/v1/quotes", json=spec, headers=self.headers)
        assert response.status_code == 200, response.text
        return response.json()

    def submit(self, spec: dict) -> dict:
        response = self.http.post("/v1/jobs", json=spec, headers=self.headers)
        assert response.status_code == 201, response.text
        return response.json()

    def job(self, job_id: str) -> dict:
        response = self.http.get(f"/v1/jobs/{job_id}", headers=self.headers)
        assert response.status_code == 200, response.text
        return response.json()

    def wait(self, job_id: str, until: Callable[[dict], bool], timeout: float = 120.0) -> dict:
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

    def finish(self, job_id: str, timeout: float = 120.0) -> dict:
        return self.wait(job_id, lambda j: j["status"] in TERMINAL, timeout)


def _engine():  # type: ignore[no-untyped-def]
    from broker.db import get_engine

    return get_engine()


def assert_ledger_matches_attempts(job_id: str) -> None:
    """Spend booked for the job == sum over attempts of billed seconds x price, exactly."""
    from broker.ledger import job_reserved, job_spent
    from broker.models import Attempt
    from broker.money import cost_micros

    with Session(_engine()) as session:
        attempts = session.exec(select(Attempt).where(Attempt.job_id == job_id)).all()
        for attempt in attempts:
            assert attempt.status == "ended"
            assert attempt.cost_micros == cost_micros(
                attempt.price_micros_per_hour, attempt.billed_seconds
            )
        assert job_spent(session, job_id) == sum(a.cost_micros for a in attempts)
        assert job_reserved(session, job_id) == 0


def set_spot(stack: Any, plan: dict, available: bool | None) -> None:
    """Force spot capacity in a plan's zone (None: back to the trace)."""
    zone = plan["zone"]
    if plan["provider"] == "aws":  # plans name AWS zone ids; the cloud knows zone names
        from broker.settings import get_settings
        from providers.aws import AwsProvider

        zone = AwsProvider.from_settings(get_settings()).resolve_zone(plan["region"], zone)
    stack.cloud.market.set_available(plan["provider"], zone, "*", available)


def assert_no_instance_left(stack: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := stack.running_instances()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []


def test_job_succeeds_and_its_ledger_equals_billed_seconds_times_price(stack: Any) -> None:
    api = Api(stack)
    job = api.submit(api.spec(hours=2.0))
    assert job["status"] == "queued"
    done = api.finish(job["id"])
    assert done["status"] == "succeeded", done
    assert done["progress"]["work_done"] == pytest.approx(2.0)
    assert done["reserved"] == "0.00"
    assert all(a["status"] == "ended" for a in done["attempts"])
    assert_ledger_matches_attempts(job["id"])
    budget = api.http.get("/v1/budget", headers=api.headers).json()
    assert budget["spent"] == done["spent"]
    assert_no_instance_left(stack)


def test_preemption_resumes_from_the_latest_checkpoint(stack: Any) -> None:
    from broker.models import Attempt

    api = Api(stack)
    job = api.submit(api.spec(hours=3.0, market="spot"))
    running = api.wait(job["id"], lambda j: j["progress"]["checkpointed_work"] > 0.4)
    first = running["attempts"][-1]
    assert first["market"] == "spot"
    set_spot(stack, first, False)
    try:
        api.wait(job["id"], lambda j: len(j["attempts"]) >= 2)
    finally:
        set_spot(stack, first, None)
    done = api.finish(job["id"])
    assert done["status"] == "succeeded", done
    with Session(_engine()) as session:
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job["id"]).order_by(Attempt.id)
        ).all()
    assert attempts[0].end_reason == "preempted"
    resumed = next(a for a in attempts[1:] if a.started_at is not None)
    # The next attempt starts from the latest checkpoint: what the first attempt reached,
    # less at most one checkpoint interval (30 min on a ~1 work/h V100, with spread).
    lost = attempts[0].work_done - resumed.work_at_start
    assert 0 <= lost <= 0.5 * 1.3 + 1e-9
    assert resumed.work_at_start > 0
    assert resumed.zone != first["zone"] or resumed.market == "on_demand"
    assert_ledger_matches_attempts(job["id"])


def test_capacity_error_in_one_zone_moves_to_the_next_plan(stack: Any) -> None:
    from broker.models import Attempt

    api = Api(stack)
    spec = api.spec(hours=1.5, market="spot")
    best = api.quote(spec)["plans"][0]
    set_spot(stack, best, False)
    try:
        job = api.submit(spec)
        done = api.finish(job["id"])
    finally:
        set_spot(stack, best, None)
    assert done["status"] == "succeeded", done
    with Session(_engine()) as session:
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job["id"]).order_by(Attempt.id)
        ).all()
    assert attempts[0].zone == best["zone"] and attempts[0].end_reason == "capacity"
    assert attempts[-1].zone != best["zone"] and attempts[-1].end_reason == "completed"
    assert_ledger_matches_attempts(job["id"])


def test_cancel_terminates_the_instance(stack: Any) -> None:
    api = Api(stack)
    job = api.submit(api.spec(hours=20.0, deadline_hours=40.0))
    running = api.wait(job["id"], lambda j: j["status"] == "running")
    instance = running["attempts"][-1]["instance_id"]
    response = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=api.headers)
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "cancelled"
    deadline = time.monotonic() + 15
    while instance in stack.running_instances():
        assert time.monotonic() < deadline, f"{instance} still running after cancel"
        time.sleep(0.3)
    assert_ledger_matches_attempts(job["id"])


def test_job_whose_max_cost_runs_out_stops_without_overspending(stack: Any) -> None:
    from broker.money import to_micros

    api = Api(stack)
    spec = api.spec(hours=3.0, market="on_demand")
    worst = api.quote(spec)["plans"][0]["worst_case_cost"]
    spec["max_cost"] = worst
    job = api.submit(spec)
    stack.training.speed_overrides[job["id"]] = 0.5  # the GPU turns out half as fast
    done = api.finish(job["id"])
    assert done["status"] == "budget_exhausted", done
    assert to_micros(done["spent"]) <= to_micros(worst)
    assert done["progress"]["work_done"] < 3.0
    assert_ledger_matches_attempts(job["id"])
    assert_no_instance_left(stack)


def test_reconcile_terminates_a_tagged_instance_the_database_does_not_know(stack: Any) -> None:
    from broker.settings import get_settings
    from providers.base import TAG_ATTEMPT, TAG_JOB, TAG_TEAM, LaunchRequest
    from providers.registry import build_providers

    aws = build_providers(get_settings())["aws"]
    ref = aws.launch(
        LaunchRequest(
            token=f"att_orphan{secrets.token_hex(4)}",
            provider="aws",
            region="us-east-1",
            zone="use1-az1",
            instance_type="p3.2xlarge",
            market="on_demand",
            gpu="V100",
            gpu_count=1,
            tags={TAG_JOB: "job_unknown", TAG_ATTEMPT: "att_unknown", TAG_TEAM: "team_x"},
            user_data={},
        )
    )
    assert aws.describe(ref).status == "running"
    deadline = time.monotonic() + 30
    while aws.describe(ref).status not in ("terminated", "preempted"):
        assert time.monotonic() < deadline, "reconcile left the orphan running"
        time.sleep(0.5)


def test_stack_logs_have_no_traceback(stack: Any) -> None:
    for name in ("worker", "api"):
        text = Path(stack.data_dir / f"{name}.log").read_text()
        assert "Traceback" not in text, text[-4000:]
