"""Worker crashes at each risky step, then a restart: nothing duplicated, lost or leaked.

``BROKER_FAULT_POINT=<step>`` makes the worker's pool process call ``os._exit`` when it
reaches that step (``broker/faults.py``). Each case starts the embedded stack with the fault
set, submits one job on AWS, waits for the crash, kills the whole worker and starts a clean
one (as an operator or a supervisor would), and checks:

- no duplicate instances: every attempt has at most one EC2 instance (launch idempotency);
- no lost job: the job finishes (succeeded);
- no orphan after a reconcile: no broker-tagged instance is left running;
- the ledger is consistent: spend == sum of billed seconds x price, nothing left reserved.

Without BROKER_TEST_DATABASE_URL: SQLite + the file-system transport (a crashed task's
message is gone; the next tick re-dispatches). With it: PostgreSQL + RabbitMQ (late acks:
the broker redelivers the task).
"""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from broker.jobs import TERMINAL
from tests.helpers import drop_postgres, fresh_postgres, reachable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PG_BASE = os.environ.get("BROKER_TEST_DATABASE_URL")


@pytest.fixture(params=["after_launch", "before_ack", "mid_settle"])
def crashed_stack(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    from broker.localstack import EmbeddedStack

    database_url = celery_url = created = None
    if PG_BASE:
        if not reachable(5672):
            pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
        celery_url = "amqp://guest:guest@127.0.0.1:5672//"
        database_url, created = fresh_postgres(PG_BASE)
    stack = EmbeddedStack(
        tmp_path / "stack",
        scale=1200.0,
        tick_seconds=1.0,
        reconcile_seconds=3.0,
        database_url=database_url,
        celery_broker_url=celery_url,
        log_level="info",
        extra_env={
            "BROKER_FAULT_POINT": request.param,
            "BROKER_CELERY_QUEUE": f"broker-crash-{secrets.token_hex(4)}",
        },
    )
    with stack:
        yield stack, request.param
    if created:
        drop_postgres(PG_BASE, created)


def _team(http: httpx.Client, admin_token: str) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": f"crash-{secrets.token_hex(3)}", "budget": {"limit": "500.00"}}
    team = http.post("/v1/teams", json=body, headers=admin)
    assert team.status_code == 201, team.text
    key = http.post(f"/v1/teams/{team.json()['id']}/keys", json={"name": "k"}, headers=admin)
    return {"Authorization": f"Bearer {key.json()['token']}"}


def _wait_for_log(path: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def _instances_per_attempt(job_id: str) -> Counter[str]:
    """EC2 instances (any state) tagged with the job, counted per attempt tag."""
    import boto3

    from broker.settings import get_settings

    settings = get_settings()
    counts: Counter[str] = Counter()
    for region in settings.aws_regions:
        ec2 = boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=settings.aws_endpoint_url,
            aws_access_key_id=settings.aws_access_key_id,
            aws_secret_access_key=settings.aws_secret_access_key.get_secret_value()
            if settings.aws_secret_access_key
            else None,
        )
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:broker-job", "Values": [job_id]}]
        )
        for page in pages:
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                    counts[tags.get("broker-attempt", "?")] += 1
    return counts


def test_a_crash_at_each_risky_step_loses_and_duplicates_nothing(crashed_stack: Any) -> None:
    from broker import clock
    from broker.db import get_engine
    from broker.ledger import job_reserved, job_spent
    from broker.models import Attempt
    from broker.money import cost_micros

    stack, step = crashed_stack
    http = httpx.Client(base_url=stack.api_url, timeout=30)
    headers = _team(http, stack.admin_token)
    spec = {
        "name": f"crash-{step}",
        "workload": {"reference_gpu_hours": 1.5},
        "resources": {"gpus": 1, "gpu_types": ["V100"], "providers": ["aws"]},
        "deadline": (clock.now() + timedelta(hours=12)).isoformat(),
        "max_cost": "60.00",
    }
    job = http.post("/v1/jobs", json=spec, headers=headers)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]

    log = Path(stack.data_dir) / "worker.log"
    _wait_for_log(log, f"fault point {step} reached", timeout=90)
    stack.restart_worker(BROKER_FAULT_POINT="")

    deadline = time.monotonic() + 120
    while (state := http.get(f"/v1/jobs/{job_id}", headers=headers).json())[
        "status"
    ] not in TERMINAL:
        assert time.monotonic() < deadline, f"job still {state['status']} after the restart"
        time.sleep(0.3)
    assert state["status"] == "succeeded", state["status_reason"]

    counts = _instances_per_attempt(job_id)
    assert counts and max(counts.values()) == 1, counts  # one instance per attempt, ever

    deadline = time.monotonic() + 20  # reconcile runs every 3 s
    while (left := stack.running_instances()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []

    with Session(get_engine()) as session:
        attempts = session.exec(select(Attempt).where(Attempt.job_id == job_id)).all()
        assert all(a.status == "ended" for a in attempts)
        for attempt in attempts:
            assert attempt.cost_micros == cost_micros(
                attempt.price_micros_per_hour, attempt.billed_seconds
            )
        assert job_spent(session, job_id) == sum(a.cost_micros for a in attempts)
        assert job_reserved(session, job_id) == 0
        assert {a.id for a in attempts if a.instance_id} <= set(counts)
