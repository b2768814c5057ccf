"""Worker crashes at each risky step, then a restart: nothing duplicated, lost or leaked.

``BROKER_FAULT_POINT=<step>`` makes the worker's pool process call ``os._exit`` when it
reaches that step (``broker/faults.py``). Each case starts the embedded stack with the fault
set, submits one job on AWS, waits for the crash, kills the whole worker and starts a clean
one (as an operator or a supervisor would), and checks:

- no duplicate instances: every attempt has at most one EC2 instance (launch idempotency);
- no lost job: the job finishes (succeeded; the slowed one the worker stops, stopped);
- no orphan after a reconcile: no broker-tagged instance is left running;
- the ledger is consistent: spend == sum of billed seconds x price, nothing left reserved.

Without BROKER_TEST_DATABASE_URL: SQLite + the file-system transport (a crashed task's
message is gone; the next tick re-dispatches). With it: PostgreSQL + RabbitMQ (late acks:
the broker redelivers the task).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.support import (
    Api,
    assert_ledger_matches_attempts,
    assert_no_instance_left,
    backend_stack,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(params=["after_launch", "before_ack", "mid_settle"])
def crashed_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    fault = {"BROKER_FAULT_POINT": request.param}
    with backend_stack(tmp_path / "stack", log_level="info", extra_env=fault) as (stack, _url):
        # The test counts every instance a job ever had: the local EC2 keeps terminated ones
        # (it forgets them an hour of market time after they ended, as EC2 does).
        stack.cloud.aws.reaper.after = timedelta(days=365)
        yield stack, request.param


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
    stack, step = crashed_stack
    api = Api(stack, limit="500.00")
    spec = api.spec(
        hours=1.5,
        deadline_hours=12.0,
        name=f"crash-{step}",
        resources={"gpus": 1, "gpu_types": ["V100"], "providers": ["aws"]},
    )
    del spec["checkpoint"]
    job_id = api.submit(spec)["id"]
    if step == "mid_settle":
        # A program's exit 0 settles its job in the API; the worker settles the jobs it stops
        # (deadline, budget, a plan that no longer fits). This one's GPU runs at a twentieth
        # of its speed (the program reads its pace at start), so the worker stops it.
        stack.speed_overrides[job_id] = 0.05

    log = Path(stack.data_dir) / "worker.log"
    _wait_for_log(log, f"fault point {step} reached", timeout=90)
    stack.restart_worker(BROKER_FAULT_POINT="")

    state = api.finish(job_id)
    if step == "mid_settle":
        assert state["status"] in ("deadline_missed", "failed", "budget_exhausted"), state
    else:
        assert state["status"] == "succeeded", state["status_reason"]

    counts = _instances_per_attempt(job_id)
    assert counts and max(counts.values()) == 1, counts  # one instance per attempt, ever
    assert_no_instance_left(stack)
    attempts = assert_ledger_matches_attempts(job_id)
    assert {a.id for a in attempts if a.instance_id} <= set(counts)
