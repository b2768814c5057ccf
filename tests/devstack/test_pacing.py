"""The pacer lowers the clock's scale when the control loop's lag log says it runs late in
broker time for a sustained while, never for a short spike, never below its floor."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.clock import ScheduleClock, read_schedule, start_schedule
from broker.devstack.pacing import Pacer, cpu_share, record_lag, starting_scale

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pacer(tmp_path: Path) -> Pacer:
    schedule = tmp_path / "clock_schedule"
    start_schedule(schedule, 900.0, datetime.now(UTC))
    return Pacer(schedule, tmp_path / "loop_lag", floor=225.0, limit_seconds=600.0)


def run_loop(pacer: Pacer, start: float, seconds: int, delay: float) -> list[float]:
    """A loop ticking once a wall second from ``start`` whose tasks start ``delay`` wall
    seconds late, as the workers log it; the scales the pacer set on the way."""
    lowered = []
    for second in range(seconds):
        wall = start + second
        record_lag(pacer.lag_log, "tick", delay, wall=wall)
        record_lag(pacer.lag_log, "observe", delay * 1.5, wall=wall)
        if (segment := pacer.poll(wall=wall)) is not None:
            lowered.append(segment[2])
    return lowered


def test_a_loop_on_time_keeps_the_scale(pacer: Pacer) -> None:
    # 0.3 wall seconds is 270 broker seconds at x900: within the limit.
    assert run_loop(pacer, time.time(), 30, 0.3) == []
    assert ScheduleClock(pacer.schedule).scale == 900.0


def test_a_short_spike_keeps_the_scale(pacer: Pacer) -> None:
    start, spike = time.time(), int(pacer.sustain_seconds / 2)
    assert run_loop(pacer, start, spike, 3.0) == []
    assert run_loop(pacer, start + spike, 20, 0.2) == []


def test_a_lagging_loop_halves_the_scale_down_to_the_floor(pacer: Pacer) -> None:
    start = time.time()
    # 2 wall seconds late is 1800 broker seconds at x900, 900 at x450, 450 at x225.
    lowered = run_loop(pacer, start, 60, 2.0)
    assert lowered == [450.0, 225.0]
    segments = read_schedule(pacer.schedule)
    assert [s[2] for s in segments] == [900.0, 450.0, 225.0]
    assert pacer.changes == segments[1:]
    # Each change waited for a full window of lag measured after the one before.
    assert segments[2][0] - segments[1][0] >= pacer.sustain_seconds


def test_a_loop_so_late_it_starts_nothing_counts_as_lagging(pacer: Pacer) -> None:
    start = time.time()
    assert run_loop(pacer, start, 3, 0.1) == []
    # Then silence: no task starts (a starved worker logs nothing until it catches up).
    lowered = [pacer.poll(wall=start + 3 + second) for second in range(8)]
    assert [segment[2] for segment in lowered if segment is not None] == [450.0]


def test_the_pacer_reads_only_whole_lines_and_survives_an_emptied_log(pacer: Pacer) -> None:
    start = time.time()
    with open(pacer.lag_log, "a") as log:
        log.write(f"{start:.3f} 5.0")  # a line still being written
    assert pacer.poll(wall=start) is None
    with open(pacer.lag_log, "a") as log:
        log.write(" tick\n")
    pacer.lag_log.write_text("")  # emptied: the pacer starts from the top again
    assert run_loop(pacer, start, 8, 2.0) == [450.0]


def _redis_url() -> str:
    url = "redis://127.0.0.1:6379/0"
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    return url


@pytest.mark.parametrize("transport", ["filesystem", "redis"])
def test_the_tick_counts_the_observations_still_waiting(tmp_path: Path, transport: str) -> None:
    # No worker: what the tick's waiting_tasks() counts is what was sent and never taken.
    # Redis keeps no queue while it is empty: that counts as 0 waiting, quietly.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["BROKER_DATA_DIR"] = str(tmp_path)  # kombu's file-system transport in there
    if transport == "redis":
        env["BROKER_CELERY_BROKER_URL"] = _redis_url()
        env["BROKER_CELERY_QUEUE"] = f"broker-test-{uuid.uuid4().hex[:8]}"
    code = (
        "from broker.settings import get_settings\n"
        "from tasks.control_loop import launch, observe, waiting_tasks\n"
        "queue = get_settings().celery_observe_queue\n"
        "print(waiting_tasks(queue))\n"
        "for n in range(3): observe.apply_async((f'a-{n}',), expires=60)\n"
        "launch.apply_async(('job-1',), expires=60)\n"
        "print(waiting_tasks(queue), waiting_tasks())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "3", "1"]  # observations and launches apart
    assert "could not count" not in done.stderr


def test_a_busy_machine_starts_the_clock_slower() -> None:
    assert starting_scale(300.0, 1.0) == 300.0
    assert starting_scale(300.0, 0.8) == 300.0  # a core to spare, give or take
    assert starting_scale(300.0, 0.6) == 150.0
    assert starting_scale(300.0, 2 / 7) == 75.0  # beside six CPU-bound processes on two cores
    assert starting_scale(300.0, 0.01) == 37.5  # not below an eighth


def test_a_process_beside_twice_as_many_busy_processes_as_cores_gets_less_than_a_core() -> None:
    cores = os.cpu_count() or 1
    if cores > 8:
        pytest.skip(f"{cores} cores: too many busy processes to start")
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cores)
    ]
    try:
        time.sleep(0.5)  # the burners are past their start-up
        share = cpu_share(0.5)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert 0.0 < share < 0.75  # about cores / (2 x cores + 1)
    assert starting_scale(300.0, share) < 300.0
