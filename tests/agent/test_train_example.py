"""``examples/train.py``, the real workload: it trains, checkpoints atomically, reports work in
the workload's units, resumes from its checkpoint after SIGTERM with no step lost, keeps the
local cloud's pace and fails on request."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.agent.fakes import ROOT, FakeBroker

pytestmark = pytest.mark.timeout(60)

TRAIN = ROOT / "examples" / "train.py"
STEP = re.compile(r"^broker: step=(\S+)(?: checkpoint=(.*))?$")


def clean_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    return {**base, **env}


def train(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TRAIN), *args],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=30,
    )


def progress(stdout: str) -> list[tuple[float, str | None]]:
    return [
        (float(m.group(1)), m.group(2))
        for m in map(STEP.match, stdout.splitlines())
        if m is not None
    ]


def params(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "model.npz") as data:
        return {name: data[name].copy() for name in data.files}


def test_it_trains_checkpoints_and_reports_work_in_the_workloads_units(tmp_path: Path) -> None:
    done = train(
        "--seed",
        "1",
        "--steps",
        "400",
        BROKER_CHECKPOINT_DIR=str(tmp_path),
        BROKER_WORK_UNIT="reference_gpu_hours",
        BROKER_TOTAL_WORK="2",
    )

    assert done.returncode == 0, done.stderr
    lines = progress(done.stdout)
    checkpoints = [(work, path) for work, path in lines if path is not None]
    assert [work for work, _ in checkpoints] == [i * 2 / 20 for i in range(1, 21)]
    assert all(path == str(tmp_path / "model.npz") for _, path in checkpoints)
    assert lines[-1] == (2.0, str(tmp_path / "model.npz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz", "state.json"]
    assert json.loads((tmp_path / "state.json").read_text()) == {
        "seed": 1,
        "step": 400,
        "steps": 400,
    }
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", done.stdout)]
    assert losses[-1] < losses[0]


def test_its_steps_default_to_the_jobs_total_work_in_steps_and_it_runs_without_the_broker(
    tmp_path: Path,
) -> None:
    done = train(
        BROKER_WORK_UNIT="steps", BROKER_TOTAL_WORK="60", BROKER_CHECKPOINT_DIR=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert progress(done.stdout)[-1][0] == 60.0

    alone = train("--steps", "50")  # no broker at all: a temp folder for its checkpoints
    assert alone.returncode == 0, alone.stderr
    assert progress(alone.stdout)[-1][0] == 50.0


def test_after_sigterm_it_checkpoints_exits_143_and_resumes_there_to_the_same_model(
    tmp_path: Path,
) -> None:
    fake = FakeBroker()
    fake.seconds_per_work_unit = 0.004  # 1000 steps: 4 s of wall time at the local pace
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    env = {
        "BROKER_CHECKPOINT_DIR": str(stopped),
        "BROKER_WORK_UNIT": "steps",
        "BROKER_TOTAL_WORK": "1000",
        "BROKER_WORKLOAD": json.dumps({"model": "ResNet-50", "batch_size": 64, "steps": 1000}),
        "BROKER_LOCAL_PACE_URL": f"{fake.url}/pace",
    }
    try:
        process = subprocess.Popen(
            [sys.executable, str(TRAIN), "--seed", "3"],
            stdout=subprocess.PIPE,
            text=True,
            env=clean_env(**env),
        )
        started, seen = time.monotonic(), 0.0
        assert process.stdout is not None
        while seen < 150:
            line = process.stdout.readline()
            assert line, "train.py ended before step 150"
            match = STEP.match(line.strip())
            seen = float(match.group(1)) if match else seen
        elapsed = time.monotonic() - started
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=20)
    finally:
        fake.close()

    assert process.returncode == 143
    assert elapsed >= 150 * 0.004 * 0.8  # paced, not at full speed
    assert json.loads(fake.of("pace")[0].body) == json.loads(env["BROKER_WORKLOAD"])
    last_work, last_path = progress(rest)[-1]
    assert last_path == str(stopped / "model.npz") and seen <= last_work < 1000
    assert int(params(stopped)["step"]) == last_work

    resumed = train(
        "--seed",
        "3",
        BROKER_CHECKPOINT_DIR=str(stopped),
        BROKER_TOTAL_WORK="1000",
        BROKER_WORK_UNIT="steps",
        BROKER_START_WORK=str(last_work),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {int(last_work)}" in resumed.stdout
    assert progress(resumed.stdout)[0][0] > last_work
    whole = train("--seed", "3", "--steps", "1000", BROKER_CHECKPOINT_DIR=str(straight))
    assert whole.returncode == 0, whole.stderr
    for name, value in params(straight).items():
        np.testing.assert_array_equal(params(stopped)[name], value)


def test_fail_at_step_exits_with_the_code_and_says_so_last(tmp_path: Path) -> None:
    done = train(
        "--steps",
        "100",
        "--fail-at-step",
        "7",
        "--exit-code",
        "3",
        BROKER_CHECKPOINT_DIR=str(tmp_path),
    )
    assert done.returncode == 3
    assert done.stderr.strip().splitlines()[-1] == "boom at step 7"
    assert progress(done.stdout)[-1][0] < 7


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    assert (
        train("--seed", "1", "--steps", "40", BROKER_CHECKPOINT_DIR=str(tmp_path)).returncode == 0
    )
    other = train("--seed", "2", "--steps", "40", BROKER_CHECKPOINT_DIR=str(tmp_path))
    assert other.returncode != 0 and "another run" in other.stderr


def gang_of_two(tmp_path: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """train.py as node 0 and node 1 of a gang on this host (folders node0, node1), to the end."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [
        subprocess.Popen(
            [sys.executable, str(TRAIN), "--seed", "5", "--steps", "60", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(
                BROKER_CHECKPOINT_DIR=str(tmp_path / f"node{rank}"),
                BROKER_NUM_NODES="2",
                BROKER_NODE_RANK=str(rank),
                BROKER_MASTER_ADDR="127.0.0.1",
                BROKER_MASTER_PORT=str(port),
            ),
        )
        for rank in (0, 1)
    ]
    done = []
    for process in processes:
        out, err = process.communicate(timeout=30)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def test_a_gang_trains_in_lockstep_and_only_node_0_checkpoints_and_reports(
    tmp_path: Path,
) -> None:
    node0, node1 = gang_of_two(tmp_path)

    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr + node1.stderr
    assert progress(node0.stdout)[-1] == (60.0, str(tmp_path / "node0" / "model.npz"))
    assert progress(node1.stdout) == [] and not (tmp_path / "node1" / "model.npz").exists()
    last = [line for line in node0.stdout.splitlines() if line.startswith("train: done")]
    assert last and last[0] in node1.stdout.splitlines()  # the same model on both nodes
    alone = train("--seed", "5", "--steps", "60", BROKER_CHECKPOINT_DIR=str(tmp_path / "alone"))
    assert last[0] in alone.stdout.splitlines()  # and the single-node run's


def test_a_gang_whose_nodes_restored_different_checkpoints_refuses_to_train(
    tmp_path: Path,
) -> None:
    first = train(
        "--seed",
        "5",
        "--steps",
        "60",
        "--fail-at-step",
        "30",
        "--checkpoint-every",
        "10",
        BROKER_CHECKPOINT_DIR=str(tmp_path / "node0"),
    )
    assert first.returncode == 1

    node0, node1 = gang_of_two(tmp_path)

    assert (node0.returncode, node1.returncode) == (1, 1)
    assert "node 1 restored step 0, node 0 step 30" in node0.stderr
    assert "node 0 said 'stop node 1 restored step 0, node 0 30'" in node1.stderr


def test_a_gang_node_whose_peer_vanishes_exits_1_saying_so(tmp_path: Path) -> None:
    node0, node1 = gang_of_two(
        tmp_path, "--fail-at-step", "20", "--fail-node", "1", "--exit-code", "3"
    )

    assert (node0.returncode, node1.returncode) == (1, 3)
    assert "train: node 0: node 1 vanished (connection closed): stopping" in node0.stderr
    assert "boom at step 20" in node1.stderr
    assert progress(node0.stdout)[-1][0] <= 21  # it stopped at the barrier node 1 missed
