"""How the agent starts the program: pure functions of ``broker/agent/agent.py`` (the argv,
the bash script, the environment, the progress line), and the SDK the program imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker.agent import agent
from tests.agent.fakes import SDK

pytestmark = pytest.mark.timeout(60)

DIRS = {
    "root": "/opt/broker",
    "checkpoint": "/opt/broker/checkpoint",
    "work": "/opt/broker/work",
    "sdk": "/opt/broker/sdk",
}


def spec(**changes: object) -> dict:
    base = {
        "attempt_id": "att_01",
        "job_id": "job_01",
        "command": "python train.py --epochs 90",
        "setup": "pip install -r requirements.txt",
        "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "env": {"WANDB_MODE": "offline", "SECRET_LIKE": "s3cr3t value"},
        "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 1000},
        "work_unit": "steps",
        "total_work": 1000.0,
        "start_work": 250.0,
    }
    base.update(changes)
    return base


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, value in enumerate(argv) if value == flag]


def test_with_an_image_on_a_cloud_the_script_runs_in_docker_with_gpus_env_names_and_mounts() -> (
    None
):
    argv = agent.command_argv(spec(), DIRS, local=False)

    assert argv[:7] == ["docker", "run", "--rm", "--gpus", "all", "--network", "host"]
    assert argv[-4:] == [spec()["image"], "bash", "-c", agent.run_script(spec())]
    assert pairs(argv, "--name") == ["broker-att_01"]
    assert pairs(argv, "-w") == ["/opt/broker/work"]
    mounts = pairs(argv, "-v")
    assert mounts == [f"{DIRS[n]}:{DIRS[n]}" for n in ("checkpoint", "work", "sdk")]
    names = pairs(argv, "-e")
    assert {"WANDB_MODE", "SECRET_LIKE", "BROKER_CHECKPOINT_DIR", "PYTHONPATH"} <= set(names)
    assert "BROKER_AGENT_TOKEN" not in names
    assert not any("s3cr3t" in value or "offline" in value for value in argv)  # values: env only


def test_without_an_image_or_on_a_local_instance_the_script_runs_with_bash_on_the_host() -> None:
    script = agent.run_script(spec())
    assert agent.command_argv(spec(), DIRS, local=True) == ["bash", "-c", script]
    assert agent.command_argv(spec(image=None), DIRS, local=False) == ["bash", "-c", script]


@pytest.mark.parametrize(
    ("setup", "expected_code", "expected_output"),
    [
        (None, 0, "command ran\n"),
        ("echo setup ran", 0, "setup ran\ncommand ran\n"),
        ("echo setup failed; exit 5", 5, "setup failed\n"),
    ],
)
def test_the_script_runs_setup_then_the_command_and_stops_at_a_failed_setup(
    setup: str | None, expected_code: int, expected_output: str
) -> None:
    script = agent.run_script(spec(setup=setup, command="echo 'command ran'"))
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)
    assert (done.returncode, done.stdout) == (expected_code, expected_output)


def test_the_program_env_has_the_jobs_env_the_broker_variables_and_not_the_agents() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "BROKER_AGENT_TOKEN": "att_secret",
        "BROKER_API_URL": "https://broker.example",
        "BROKER_LOCAL_PACE_URL": "http://127.0.0.1:1/i-1/broker-local/pace",
        "PYTHONPATH": "/host/lib",
    }
    env = agent.program_env(spec(), DIRS, base)

    assert env["PATH"] == "/usr/bin" and env["WANDB_MODE"] == "offline"
    assert "BROKER_AGENT_TOKEN" not in env and "BROKER_API_URL" not in env
    assert env["BROKER_LOCAL_PACE_URL"] == base["BROKER_LOCAL_PACE_URL"]
    assert env["PYTHONPATH"] == os.pathsep.join(["/opt/broker/sdk", "/host/lib"])
    assert (env["BROKER_TOTAL_WORK"], env["BROKER_START_WORK"]) == ("1000", "250")
    assert env["BROKER_WORK_UNIT"] == "steps"
    assert env["BROKER_STOP_FILE"].startswith("/opt/broker/sdk/")
    # In docker the program gets exactly these (a local instance never runs docker).
    passed = set(pairs(agent.command_argv(spec(), DIRS, local=False), "-e"))
    broker_vars = {n for n in env if n.startswith("BROKER_")} - {"BROKER_LOCAL_PACE_URL"}
    expected = set(spec()["env"]) | broker_vars | {"PYTHONPATH", "TINI_KILL_PROCESS_GROUP=1"}
    assert passed == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("broker: step=120\n", ("120", None)),
        ("broker: step=0.25 checkpoint=/ck/model 1.pt\n", ("0.25", "/ck/model 1.pt")),
        ("broker: step=7 checkpoint=\n", ("7", "")),
        ("step=7\n", None),
        ("  broker: step=7\n", None),
    ],
)
def test_progress_lines(line: str, expected: tuple[str, str | None] | None) -> None:
    match = agent.PROGRESS_LINE.match(line)
    assert (match.groups() if match else None) == expected


def test_the_sdk_prints_the_protocols_lines_and_says_stop_after_sigterm_or_the_stop_file(
    tmp_path,
) -> None:
    stop_file = tmp_path / "stop"
    source = f"""
import os, signal, sys
sys.path.insert(0, {str(SDK.parent)!r})
import broker_sdk
broker_sdk.report(5)
broker_sdk.report(6)  # within a second of the last line: not printed
broker_sdk.checkpoint_saved()
broker_sdk.checkpoint_saved("/ck/x.pt", step=9)
print(broker_sdk.should_stop())
open({str(stop_file)!r}, "w").close()
print(broker_sdk.should_stop())
os.remove({str(stop_file)!r})
print(broker_sdk.should_stop())  # stays True
"""
    env = dict(os.environ, BROKER_CHECKPOINT_DIR="/ck", BROKER_STOP_FILE=str(stop_file))
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=20
    )
    assert done.stdout.splitlines() == [
        "broker: step=5",
        "broker: step=6 checkpoint=/ck",
        "broker: step=9 checkpoint=/ck/x.pt",
        "False",
        "True",
        "True",
    ], done.stderr

    on_sigterm = f"""
import os, signal, sys
sys.path.insert(0, {str(SDK.parent)!r})
import broker_sdk
broker_sdk.should_stop()
os.kill(os.getpid(), signal.SIGTERM)
print(broker_sdk.should_stop())
"""
    done = subprocess.run(
        [sys.executable, "-c", on_sigterm], capture_output=True, text=True, env=env, timeout=20
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


def test_the_sdk_says_the_nodes_rank_count_and_rendezvous() -> None:
    source = f"""
import sys
sys.path.insert(0, {str(SDK.parent)!r})
import broker_sdk
print(broker_sdk.node_rank(), broker_sdk.num_nodes(), broker_sdk.master())
"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    gang = agent.gang_env(
        {"node_rank": 2, "nodes": 4, "master_addr": "10.1.2.3", "master_port": 29500}
    )
    for env, expected in (
        (base, "0 1 None"),
        ({**base, **agent.gang_env(None)}, "0 1 None"),
        ({**base, **gang}, "2 4 ('10.1.2.3', 29500)"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=20
        )
        assert done.stdout.strip() == expected, done.stderr
    assert (gang["NODE_RANK"], gang["NNODES"], gang["MASTER_ADDR"], gang["MASTER_PORT"]) == (
        "2",
        "4",
        "10.1.2.3",
        "29500",
    )
