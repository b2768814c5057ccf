"""Multi-node jobs end to end on the embedded stack: a gang of local instances (real process
groups, each running the boot script and the agent) trains ``examples/train.py`` in its
multi-node mode, synchronising every step over TCP through node 0's rendezvous address; a
preemption notice to one node stops the gang, which relaunches from its checkpoint. SQLite
with the file-system transport, or PostgreSQL with RabbitMQ."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from broker.core.job_status import JobStatus
from tests.e2e.support import Api, assert_ledger_matches_attempts, assert_no_instance_left
from tests.e2e.support import backend_stack as _backend_stack
from tests.e2e.test_workloads import attempts_of, checkpoints_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def nodes_of(attempt_id: str) -> list[Any]:
    from broker.db.engine import get_engine
    from broker.db.models import AttemptNode

    with Session(get_engine()) as session:
        return list(
            session.exec(
                select(AttemptNode)
                .where(AttemptNode.attempt_id == attempt_id)
                .order_by(col(AttemptNode.rank))
            ).all()
        )


def gang_spec(api: Api, hours: float, steps: int, seed: int) -> dict:
    # Spot only: steering never moves the gang to another market, so the attempt the test
    # gives notice to ends by that notice.
    return api.spec(
        hours=hours,
        resources={"gpus": 1, "nodes": 2, "gpu_types": ["V100"], "providers": ["aws"]},
        market="spot",
        run=api.run(f"--seed {seed} --steps {steps}"),
    )


def running_gang(stack: Any, job_id: str, timeout: float = 90.0) -> tuple[Any, list[Any]]:
    """The job's running gang attempt once its node 0 has saved a checkpoint and every node's
    instance is alive."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        saved = {c.attempt_id for c in checkpoints_of(job_id)}
        for attempt in attempts_of(job_id):
            if attempt.status != "running" or attempt.id not in saved:
                continue
            nodes = nodes_of(attempt.id)
            records = [stack.cloud.instances.get(n.instance_id) for n in nodes]
            if len(records) == attempt.nodes and all(r is not None and r.alive for r in records):
                return attempt, records
        time.sleep(0.2)
    raise AssertionError(f"no running, checkpointed gang for {job_id}: {attempts_of(job_id)}")


def test_a_two_node_gang_trains_in_step_survives_a_notice_to_one_node_and_bills_both(
    tmp_path: Path,
) -> None:
    with _backend_stack(tmp_path) as (stack, _):
        api = Api(stack)
        try:
            quote = api.quote(gang_spec(api, hours=2.0, steps=1500, seed=7))
            best = quote["plans"][0]
            assert best["nodes"] == 2 and best["gpu_count"] == 1

            job = api.submit(gang_spec(api, hours=2.0, steps=1500, seed=7))
            first, records = running_gang(stack, job["id"])
            assert first.nodes == 2
            nodes = nodes_of(first.id)
            assert [n.rank for n in nodes] == [0, 1]
            assert nodes[0].instance_id == first.instance_id
            assert len({n.instance_id for n in nodes}) == 2
            assert first.master_addr and first.master_port
            # A spot notice reaches node 1 only: the whole gang stops and relaunches.
            stack.cloud.instances.notice(records[1].instance_id, records[1].provider)

            done = api.finish(job["id"], timeout=360)
            assert done["status"] == JobStatus.SUCCEEDED.value, done
            tries = attempts_of(job["id"])
            ended = next(a for a in tries if a.id == first.id)
            assert ended.end_reason == "preempted"
            later = tries[tries.index(ended) + 1 :]
            assert later and all(a.nodes == 2 for a in later)
            # The relaunched gang starts from the checkpoint node 0 saved.
            saved = [c for c in checkpoints_of(job["id"]) if c.attempt_id == first.id]
            assert saved and later[0].work_at_start == pytest.approx(
                max(c.work_done for c in saved)
            )
            # Each attempt is billed for both nodes: the gang's price is twice the instance's
            # (the stack replays no price moves, so the listed price is the launch's).
            listed = {
                (p["zone"], p["instance_type"], p["market"]): p["price_per_hour"]
                for p in api.client.prices(gpu="V100", provider="aws")
            }
            for attempt in tries:
                instance = Decimal(listed[(attempt.zone, attempt.instance_type, attempt.market)])
                assert attempt.price_micros_per_hour == 2 * int(instance * 1_000_000)
            assert_ledger_matches_attempts(job["id"])
            # Logs per node: node 1's program wrote its own lines.
            log1 = api.client.logs(job["id"], node=1)
            assert "node 1" in log1 or "rank=1" in log1, log1[-2000:]
            assert_no_instance_left(stack)
        finally:
            api.close()
