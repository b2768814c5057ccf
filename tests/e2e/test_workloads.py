"""Real workloads on the embedded stack: every instance is a process group running the boot
script, which fetches the agent from the API; the agent runs ``examples/train.py`` from a
workdir the team uploaded, restores and uploads checkpoints to S3 on moto, streams logs,
reports progress and the exit code, and answers a preemption notice from the local metadata
server. SQLite with the file-system transport, or PostgreSQL with RabbitMQ."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from broker.core.job_status import JobStatus
from tests.e2e.support import Api, assert_ledger_matches_attempts, backend_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def attempts_of(job_id: str) -> list[Any]:
    from broker.db.engine import get_engine
    from broker.db.models import Attempt

    with Session(get_engine()) as session:
        return list(
            session.exec(
                select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.created_at))
            ).all()
        )


def checkpoints_of(job_id: str) -> list[Any]:
    from broker.db.engine import get_engine
    from broker.db.models import Checkpoint

    with Session(get_engine()) as session:
        return list(
            session.exec(
                select(Checkpoint)
                .where(Checkpoint.job_id == job_id)
                .order_by(col(Checkpoint.created_at))
            ).all()
        )


def store_keys(prefix: str) -> list[str]:
    from broker.settings import get_settings
    from providers.storage import S3CheckpointStore

    return S3CheckpointStore.from_settings(get_settings()).list_keys(prefix)


def running_instance(
    stack: Any, job_id: str, timeout: float = 60.0, checkpointed: bool = False
) -> Any:
    """The job's running attempt and its local instance record, once its agent has reported
    (and, with ``checkpointed``, once it has saved a checkpoint)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        saved = {c.attempt_id for c in checkpoints_of(job_id)} if checkpointed else set()
        for attempt in attempts_of(job_id):
            if checkpointed and attempt.id not in saved:
                continue
            if attempt.status == "running" and attempt.last_heard_at is not None:
                record = stack.cloud.instances.get(attempt.instance_id)
                if record is not None and record.alive:
                    return attempt, record
        time.sleep(0.2)
    raise AssertionError(f"no running, reporting attempt for {job_id}: {attempts_of(job_id)}")


def test_a_real_program_runs_checkpoints_resumes_after_a_notice_and_fails_on_its_exit_code(
    tmp_path: Path,
) -> None:
    with backend_stack(tmp_path) as (stack, _):
        api = Api(stack)
        try:
            # 1. A program that runs to the end: succeeded, checkpoints in S3, logs served.
            ok = api.submit(api.spec(hours=1.0, run=api.run("--seed 1 --steps 400")))
            # 2. A program that fails: exit code 3, restarted once, then failed.
            failing = api.run("--seed 2 --steps 400 --fail-at-step 5 --exit-code 3")
            bad = api.submit(api.spec(hours=1.0, run=failing, max_restarts_on_errors=1))
            # 3. A program whose spot instance gets a preemption notice while it trains.
            noticed = api.submit(api.spec(hours=3.0, run=api.run("--seed 3 --steps 2000")))
            attempt, record = running_instance(stack, noticed["id"], checkpointed=True)
            stack.cloud.instances.notice(record.instance_id, record.provider)

            done = api.finish(ok["id"], timeout=240)
            assert done["status"] == JobStatus.SUCCEEDED.value, done
            keys = store_keys(f"jobs/{ok['id']}/checkpoints/")
            assert keys and all(k.endswith(".tar.gz") for k in keys)
            log = api.client.logs(ok["id"])
            assert "broker: step=" in log and "==> attempt" in log
            assert_ledger_matches_attempts(ok["id"])

            failed = api.finish(bad["id"], timeout=240)
            assert failed["status"] == JobStatus.FAILED.value, failed
            assert "exit code 3" in failed["status_reason"]
            assert "boom" in failed["status_reason"]
            tries = attempts_of(bad["id"])
            assert [a.exit_code for a in tries] == [3, 3]
            assert_ledger_matches_attempts(bad["id"])

            resumed = api.finish(noticed["id"], timeout=300)
            assert resumed["status"] == JobStatus.SUCCEEDED.value, resumed
            tries = attempts_of(noticed["id"])
            first = next(a for a in tries if a.id == attempt.id)
            second = tries[tries.index(first) + 1]
            assert first.end_reason == "preempted"
            # The program checkpointed on SIGTERM: the next attempt starts from that work.
            saved = [c for c in checkpoints_of(noticed["id"]) if c.attempt_id == first.id]
            assert saved, "no checkpoint from the noticed attempt"
            assert second.work_at_start == pytest.approx(max(c.work_done for c in saved))
            assert second.work_at_start >= 0.95 * first.work_done
            assert_ledger_matches_attempts(noticed["id"])
        finally:
            api.close()


def test_a_silent_agent_is_declared_lost_billed_to_that_moment_and_replaced(
    tmp_path: Path,
) -> None:
    silence = {  # broker seconds: 5 and 10 wall seconds at x1200
        "BROKER_AGENT_SILENCE_SECONDS": "6000",
        "BROKER_AGENT_BOOT_GRACE_SECONDS": "12000",
    }
    with backend_stack(tmp_path, extra_env=silence) as (stack, _):
        api = Api(stack)
        try:
            job = api.submit(api.spec(hours=2.0, run=api.run("--seed 4 --steps 1000")))
            attempt, record = running_instance(stack, job["id"])
            os.killpg(record.process.pid, signal.SIGSTOP)  # the agent freezes; nothing reports

            done = api.finish(job["id"], timeout=300)
            assert done["status"] == JobStatus.SUCCEEDED.value, done
            lost = next(a for a in attempts_of(job["id"]) if a.id == attempt.id)
            assert lost.end_reason == "lost"
            assert lost.billed_seconds == pytest.approx(
                (lost.ended_at - lost.started_at).total_seconds(), abs=1
            )
            assert lost.ended_at - lost.last_heard_at >= timedelta(seconds=6000)
            assert len(attempts_of(job["id"])) >= 2
            assert_ledger_matches_attempts(job["id"])
        finally:
            api.close()
