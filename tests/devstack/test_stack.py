"""The embedded stack's processes: a worker that dies is started again, and nothing it started
outlives it: not a worker's beat when the worker dies, not any child when the stack dies."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.devstack.stack import EmbeddedStack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

if os.environ.get("BROKER_TEST_DATABASE_URL"):
    pytest.skip(
        "the stack's processes do not depend on the database; the SQLite pass covers them",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[2]
QUICK = {"BROKER_HEARTBEAT_SECONDS": "0.5", "BROKER_LIVENESS_TIMEOUT_SECONDS": "4"}


def session_of(leader: int) -> set[int]:
    """Live processes (zombies excluded) of the session ``leader`` started."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (command)"
        state, session = fields[0], int(fields[3])
        if session == leader and state != "Z":
            found.add(int(entry.name))
    return found


def alive(pids: set[int]) -> set[int]:
    still = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            still.add(pid)
    return still


def eventually(check: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """``check()``'s first truthy result; fails saying ``what`` (or what it returns then)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what() if callable(what) else what} within {timeout} s")
        time.sleep(0.2)


def healthy(api_url: str) -> bool:
    try:
        body = httpx.get(f"{api_url}/healthz", timeout=5).json()
    except httpx.HTTPError:
        return False
    return bool(body["status"] == "ok")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    with EmbeddedStack(tmp_path_factory.mktemp("stack"), extra_env=QUICK) as running:
        yield running


def test_a_dead_worker_is_started_again_and_its_beat_dies_with_it(
    stack: EmbeddedStack, caplog: pytest.LogCaptureFixture
) -> None:
    eventually(lambda: healthy(stack.api_url), 60, "the stack never became healthy")
    worker = stack.child_pids()["worker"]
    # The worker's main process, its pool (2) and its embedded beat.
    children = eventually(lambda: session_of(worker) - {worker}, 30, "no pool or beat")
    assert len(children) >= 3, children

    with caplog.at_level(logging.WARNING, logger="broker.devstack.stack"):
        os.kill(worker, signal.SIGKILL)  # the main process only, as a crash would
        # Orphaned pool processes and beat stop by themselves.
        eventually(lambda: not alive(children), 30, lambda: f"orphans {alive(children)} ran")
        new = eventually(
            lambda: stack.child_pids()["worker"] != worker and stack.child_pids()["worker"],
            30,
            "the supervisor did not start the worker again",
        )
    assert stack.restarts == {"worker": 1}
    assert stack.worker_alive()
    assert any("worker exited with -9; starting it again" in r.message for r in caplog.records)
    # The new worker runs tasks and beat: healthz sees both again.
    eventually(lambda: healthy(stack.api_url), 60, "healthz never saw the new worker")
    assert new in session_of(new)


def test_agents_get_patience_on_the_fast_clock_and_instances_a_private_folder(
    stack: EmbeddedStack,
) -> None:
    patient = f"{max(600.0, 30 * stack.scale):g}"
    assert stack.env["BROKER_AGENT_SILENCE_SECONDS"] == patient
    assert stack.env["BROKER_AGENT_BOOT_GRACE_SECONDS"] == patient
    assert stack.env["BROKER_AGENT_REPORT_SECONDS"] == f"{max(60.0, stack.scale):g}"
    folder = stack.data_dir / "instances"
    assert stack.cloud.instances.instances_dir == folder
    assert folder.stat().st_mode & 0o777 == 0o700
    assert stack.cloud.instances.runner == "process"
    assert stack.speed_overrides is stack.cloud.instances.speed_overrides


def test_stopping_the_stack_does_not_restart_anything(tmp_path: Path) -> None:
    running = EmbeddedStack(tmp_path / "stopping", extra_env=QUICK).start()
    pids = running.child_pids()
    running.stop()
    time.sleep(1.5)  # three supervisor rounds, had it survived
    assert running.restarts == {}
    assert not alive(set().union(*(session_of(pid) | {pid} for pid in pids.values())))


STACK_SCRIPT = """
import json, sys, time
from pathlib import Path
from broker.devstack.stack import EmbeddedStack
stack = EmbeddedStack(Path(sys.argv[1]), extra_env=json.loads(sys.argv[2])).start()
print(json.dumps({"api_url": stack.api_url, "pids": stack.child_pids()}), flush=True)
time.sleep(600)
"""


def test_every_child_dies_with_the_stacks_process(tmp_path: Path) -> None:
    everyone: set[int] = set()
    parent = subprocess.Popen(
        [sys.executable, "-c", STACK_SCRIPT, str(tmp_path / "orphans"), json.dumps(QUICK)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("BROKER_")},
    )
    try:
        assert parent.stdout is not None
        started = json.loads(parent.stdout.readline())
        eventually(lambda: healthy(started["api_url"]), 60, "the stack never became healthy")
        leaders = set(started["pids"].values())

        def all_children() -> set[int]:  # api + worker main + 2 pool processes + beat
            found = set().union(*(session_of(pid) for pid in leaders))
            return found if len(found) >= 5 else set()

        everyone = eventually(
            all_children, 30, "the API, the worker, its pool and its beat did not all run"
        )

        parent.kill()  # SIGKILL: no stop(), no cleanup of any kind
        parent.wait(timeout=10)

        eventually(lambda: not alive(everyone), 60, lambda: f"{alive(everyone)} outlived it")
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in alive(everyone):  # what a failed check left behind
            os.kill(pid, signal.SIGKILL)
