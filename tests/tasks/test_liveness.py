"""The worker's side of liveness: an embedded beat does not outlive the worker that forked it
(a real ``celery -A tasks worker --beat`` on kombu's file-system transport)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def children(parent: int) -> set[int]:
    """Live (not zombie) processes whose parent is ``parent``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == parent:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_embedded_beat_stops_when_its_worker_is_killed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(BROKER_DATA_DIR=str(tmp_path), BROKER_HEARTBEAT_SECONDS="0.5")
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tasks", "worker", "--beat",
                "--schedule", str(tmp_path / "celerybeat-schedule"), "--concurrency", "1",
                "--loglevel", "info", "--without-gossip", "--without-mingle",
            ],
            env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "Sending due task heartbeat" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        forked = children(worker.pid)  # the pool process and the beat
        assert len(forked) == 2, forked

        worker.kill()  # SIGKILL the worker's main process only
        worker.wait(timeout=10)

        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in forked):
            assert time.monotonic() < deadline, f"{[p for p in forked if alive(p)]} outlived it"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
