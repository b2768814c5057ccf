"""A gang end to end (issue 20): two real agents, node 0 and node 1 of one attempt, against the
real API over HTTP (uvicorn) and a real S3 server (moto), run ``examples/train.py`` in
multi-node mode. The nodes meet at the rendezvous node 0 reports, train in lockstep from the
same checkpoint, only node 0 reports work and uploads checkpoints, each node's output is
readable on its own, and node 1's failure ends the gang's attempt with its exit code."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlmodel import Session

from broker.client import BrokerClient
from broker.db.models import Attempt, Job
from broker.services import lifecycle
from broker.services.launch_request import agent_token
from broker.services.plans import job_plan
from tests.agent.fakes import AGENT, ROOT, FakeBroker, fake_broker
from tests.helpers import LEASE, job_spec

pytestmark = pytest.mark.timeout(180)

TRAIN = ROOT / "examples" / "train.py"
STEPS, WORK = 120, 1200  # train.py's steps; the job's work (ResNet-50 steps): 10 a step
STEP_LINE = re.compile(r"^train: step \d+/\d+ loss .*$", re.M)


def command(*extra: str) -> str:
    args = [sys.executable, str(TRAIN), "--seed", "4", "--steps", str(STEPS), *extra]
    return " ".join(shlex.quote(a) for a in [*args, "--checkpoint-every", "20"])


@pytest.fixture
def metadata() -> Iterator[list[FakeBroker]]:
    """Per node, an instance metadata server (and the local cloud's pace: about 3 s a run)."""
    with fake_broker() as node0, fake_broker() as node1:
        for fake in (node0, node1):
            fake.seconds_per_work_unit = 3.0 / WORK
        yield [node0, node1]


@pytest.fixture
def launch_gang(client, make_team, db_engine, clock, store):  # type: ignore[no-untyped-def]
    """Submit a job running ``run_command`` and launch a 2-node attempt for it (the job's
    next attempt when ``job_id`` is given); (job id, attempt id, token, team headers)."""

    def launch(
        run_command: str, job_id: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[str, str, str, dict[str, str]]:
        if job_id is None:
            _, headers = make_team()
            spec = job_spec(
                workload={"model": "ResNet-50", "batch_size": 128, "steps": WORK},
                run={"command": run_command},
                max_restarts_on_errors=1,
            )
            answer = client.post("/v1/jobs", json=spec, headers=headers)
            assert answer.status_code == 201, answer.text
            job_id = answer.json()["id"]
        with Session(db_engine, expire_on_commit=False) as session:
            row = session.get(Job, job_id)
            row.spec = {**row.spec, "run": {"command": run_command}}
            session.add(row)
            session.commit()
            attempt, token = lifecycle.begin_attempt(
                session,
                row.id,
                replace(job_plan(row), nodes=2),
                clock.now(),
                token_for=lambda attempt_id: agent_token("s", attempt_id, row.deadline),
            )
            lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        clock.advance(3600)  # the work reported must be credible for the GPUs' speed
        # A fast clock, like the local clouds': a 2 s notice window (120 broker seconds).
        clock.scale = 60.0
        assert headers is not None
        return job_id, attempt.id, token, headers

    return launch


@pytest.fixture
def start_node(live_server, metadata, tmp_path):  # type: ignore[no-untyped-def]
    """Start the agent of node ``rank`` as a local instance's boot script does."""
    started: list[subprocess.Popen] = []

    def start(
        attempt_id: str, token: str, rank: int, folder: str, **extra: str
    ) -> subprocess.Popen:
        fake = metadata[rank]
        env = fake.agent_env(
            tmp_path / folder,
            BROKER_API_URL=live_server,
            BROKER_ATTEMPT_ID=attempt_id,
            BROKER_AGENT_TOKEN=token,
            BROKER_NODE_RANK=str(rank),
            BROKER_LOCAL_PACE_URL=f"{fake.url}/pace",
            **extra,
        )
        process = subprocess.Popen(
            [sys.executable, str(AGENT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def finish(process: subprocess.Popen, timeout: float = 90) -> tuple[int, str, str]:
    """Wait for an agent: its exit code, stdout (the program's output) and stderr."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the agent did not finish:\n{out[-3000:]}\n{err[-3000:]}") from None
    return process.returncode, out, err


def attempt_row(db_engine, attempt_id: str) -> Attempt:  # type: ignore[no-untyped-def]
    with Session(db_engine, expire_on_commit=False) as session:
        return session.get(Attempt, attempt_id)


def test_two_nodes_train_in_lockstep_to_the_end_and_only_node_0_checkpoints(
    client, launch_gang, start_node, db_engine, store, tmp_path, live_server
):
    job_id, attempt_id, token, team = launch_gang(command())
    node1 = start_node(attempt_id, token, 1, "node1")  # the later node waits for node 0
    node0 = start_node(attempt_id, token, 0, "node0")

    code0, out0, err0 = finish(node0)
    code1, out1, err1 = finish(node1)

    assert (code0, code1) == (0, 0), err0 + err1
    assert "the rendezvous is 127.0.0.1:" in err0 and "node 1 of 2: the rendezvous" in err1
    job = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    assert job["status"] == "succeeded", job
    row = attempt_row(db_engine, attempt_id)
    assert (row.nodes, row.master_addr, row.exit_code) == (2, "127.0.0.1", 0)
    assert row.master_port is not None and f"127.0.0.1:{row.master_port}" in err0
    # Only node 0 saved and uploaded checkpoints: every 20 steps, the last holding all the work.
    works = sorted(c["work_done"] for c in job["checkpoints"])
    assert works[-1] == WORK and len(works) >= 2
    stored = store.list_keys(f"jobs/{job_id}/checkpoints/{attempt_id}/")
    assert len(stored) == len(works)
    assert (tmp_path / "node0" / "checkpoint" / "model.npz").exists()
    assert list((tmp_path / "node1" / "checkpoint").iterdir()) == []
    assert "broker: step=" in out0 and "broker: step=" not in out1
    # Each node's log on its own: the same steps with the same loss, so the same model.
    logs = f"/v1/jobs/{job_id}/logs"
    log0 = client.get(logs, params={"attempt": attempt_id}, headers=team).text
    with BrokerClient(live_server, team["Authorization"].removeprefix("Bearer ")) as api:
        log1 = api.logs(job_id, attempt_id, node=1)  # the SDK's node parameter
    assert "train: node 0 of 2 joined the gang at step 0" in log0
    assert "train: node 1 of 2 joined the gang at step 0" in log1
    assert "broker: step=" in log0 and "broker: step=" not in log1
    steps0, steps1 = STEP_LINE.findall(log0), STEP_LINE.findall(log1)
    assert len(steps0) == STEPS // 20 and steps1 and steps1 == steps0[: len(steps1)]
    assert STEP_LINE.findall(out1) == steps0  # node 1's own output: every step line


def test_node_1s_failure_ends_the_gangs_attempt_and_the_next_gang_resumes_from_node_0s_checkpoint(
    client, launch_gang, start_node, db_engine, tmp_path
):
    failing = command("--fail-at-step", "60", "--fail-node", "1", "--exit-code", "3")
    job_id, first, token, team = launch_gang(failing)
    node0 = start_node(first, token, 0, "first0")
    node1 = start_node(first, token, 1, "first1")

    code1, out1, err1 = finish(node1)
    code0, out0, err0 = finish(node0)

    assert code1 == 0, err1  # it reported its program's exit 3
    assert "reported exit code 3" in err1
    assert "node 1 vanished" in out0 and "not reporting the exit" in err0
    row = attempt_row(db_engine, first)
    assert (row.end_reason, row.exit_code) == ("exit code 3", 3)
    job = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    assert job["status"] == "provisioning", job
    assert max(c["work_done"] for c in job["checkpoints"]) == 600  # step 60, node 0's

    _, second, token, _ = launch_gang(command(), job_id, team)
    node1 = start_node(second, token, 1, "second1")
    node0 = start_node(second, token, 0, "second0")
    (code0, out0, err0), (code1, out1, err1) = finish(node0), finish(node1)

    assert (code0, code1) == (0, 0), err0 + err1
    for out in (out0, out1):
        assert "train: resuming from step 60" in out
        assert "joined the gang at step 60" in out
    assert client.get(f"/v1/jobs/{job_id}", headers=team).json()["status"] == "succeeded"
    node1_log = client.get(f"/v1/jobs/{job_id}/logs", params={"node": 1}, headers=team).text
    assert f"==> attempt {first} node 1 " in node1_log and "boom at step 60" in node1_log
    assert f"==> attempt {second} node 1 " in node1_log


def test_a_notice_on_node_1_ends_the_gang_as_preempted_and_node_0_stops_quietly(
    client, launch_gang, start_node, metadata, db_engine
):
    job_id, attempt_id, token, team = launch_gang(command())
    node0 = start_node(attempt_id, token, 0, "node0")
    node1 = start_node(attempt_id, token, 1, "node1")
    fake1: FakeBroker = metadata[1]
    fake1.wait_for(lambda: len(fake1.of("pace")) >= 1)  # node 1's program is training
    fake1.notice.set()

    (code1, out1, err1), (code0, _, err0) = finish(node1), finish(node0)

    assert (code0, code1) == (0, 0), err0 + err1
    assert "reported the preemption: job preempted" in err1
    row = attempt_row(db_engine, attempt_id)
    assert row.end_reason == "preempted", (row.end_reason, err0, err1)
    assert "the gang stopped at step" in out1
    assert "reported exit code" not in err0 and "(HTTP 409)" in err0
    job = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    assert job["status"] == "preempted" and "node 1: spot instance-action" in job["status_reason"]


def test_a_node_without_a_rendezvous_gives_up_with_a_non_zero_exit_report(
    client, launch_gang, start_node, db_engine
):
    job_id, attempt_id, token, team = launch_gang(command())
    node1 = start_node(attempt_id, token, 1, "alone", BROKER_RENDEZVOUS_WAIT_SECONDS="2")

    code, _, err = finish(node1, 30)

    assert code == 0, err  # it reported the failure
    assert "node 0 reported no rendezvous within 2 s: giving up" in err
    row = attempt_row(db_engine, attempt_id)
    assert (row.end_reason, row.exit_code) == ("exit code 1", 1)
    reason = client.get(f"/v1/jobs/{job_id}", headers=team).json()["status_reason"]
    assert reason.startswith("exit code 1: restarting")


def test_a_notice_on_node_0_stops_the_gang_at_a_checkpoint_and_node_1_does_not_report(
    client, launch_gang, start_node, metadata, db_engine
):
    job_id, attempt_id, token, team = launch_gang(command())
    node0 = start_node(attempt_id, token, 0, "node0")
    node1 = start_node(attempt_id, token, 1, "node1")
    fake0: FakeBroker = metadata[0]
    fake0.wait_for(lambda: len(fake0.of("pace")) >= 1)  # node 0's program is training
    fake0.notice.set()

    (code0, out0, err0), (code1, out1, err1) = finish(node0), finish(node1)

    assert (code0, code1) == (0, 0), err0 + err1
    stopped = re.search(r"train: SIGTERM at step (\d+)/", out0)
    assert stopped is not None, out0
    step = int(stopped.group(1))
    assert f"train: node 1: the gang stopped at step {step}/{STEPS}" in out1
    assert "reported the preemption: job preempted" in err0
    assert "reported exit code" not in err1
    row = attempt_row(db_engine, attempt_id)
    assert (row.end_reason, row.exit_code) == ("preempted", None)
    job = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    assert job["status"] == "preempted"
    assert max(c["work_done"] for c in job["checkpoints"]) == step * WORK / STEPS
