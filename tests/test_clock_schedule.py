"""The schedule clock: broker time from a shared, append-only file of segments whose scale the
embedded stack lowers while every process keeps agreeing on "now"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker import clock
from broker.agent.agent import LeaseClock
from broker.clock import (
    ScaledClock,
    ScheduleClock,
    broker_seconds,
    lower_scale,
    read_schedule,
    start_schedule,
)
from broker.settings import get_settings


@pytest.fixture
def schedule(tmp_path: Path) -> Path:
    path = tmp_path / "clock_schedule"
    start_schedule(path, 900.0, datetime.now(UTC) - timedelta(seconds=10))
    return path


def sample(reader: ScheduleClock, seconds: float) -> list[datetime]:
    until, seen = time.monotonic() + seconds, []
    while time.monotonic() < until:
        seen.append(reader.now())
        time.sleep(0.01)
    return seen


def test_a_lowered_scale_continues_broker_time_where_the_old_one_had_it(schedule: Path) -> None:
    first = lower_scale(schedule, 450.0, lead_seconds=1.0)
    second = lower_scale(schedule, 225.0, lead_seconds=2.0)
    segments = read_schedule(schedule)
    assert segments[1:] == [first, second]
    for before, after in zip(segments, segments[1:], strict=False):
        # At each change both segments give the same broker time: no jump either way.
        continued = before[1] + (after[0] - before[0]) * before[2]
        assert after[1] == pytest.approx(continued, abs=1e-6)
        assert broker_seconds(segments, after[0] - 1e-3) == pytest.approx(continued, abs=1.0)


def test_broker_time_is_monotonic_and_runs_at_the_new_scale_after_a_change(
    schedule: Path,
) -> None:
    reader = ScheduleClock(schedule)
    reader.now()
    # No lead: this reader sees the change up to half a second late, having run ahead at
    # x900 meanwhile; it waits for broker time to catch up (half a second), never goes back.
    lower_scale(schedule, 450.0, lead_seconds=0.0)
    seen = sample(reader, 1.5)
    assert all(a <= b for a, b in zip(seen, seen[1:], strict=False))
    wall = time.time()
    start = reader.now()
    time.sleep(0.5)
    rate = (reader.now() - start).total_seconds() / (time.time() - wall)
    assert rate == pytest.approx(450.0, rel=0.1)
    assert reader.scale == 450.0


def test_independent_readers_agree_before_and_after_a_change(schedule: Path) -> None:
    one, other = ScheduleClock(schedule), ScheduleClock(schedule)
    agent = LeaseClock(900.0, str(schedule))  # the agent's own copy of the reader
    segment = lower_scale(schedule, 300.0, lead_seconds=1.0)
    for _ in range(2):  # before the change takes effect, then after
        time.sleep(1.1)
        assert one.segments() == other.segments() == read_schedule(schedule)
        before = one.now()
        between, agent_between = other.now(), agent.now()
        after = one.now()
        assert before <= between <= after
        assert before.timestamp() - 1e-3 <= agent_between <= after.timestamp() + 1e-3
    assert time.time() > segment[0] and one.scale == other.scale == 300.0


@pytest.fixture
def fresh_clock() -> Iterator[None]:
    clock.set_clock(None)
    get_settings.cache_clear()
    yield
    clock.set_clock(None)
    get_settings.cache_clear()


def test_without_a_schedule_file_the_clock_is_the_fixed_scale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_clock: None
) -> None:
    epoch = datetime.now(UTC) - timedelta(seconds=100)
    monkeypatch.setenv("BROKER_CLOCK_SCALE", "600")
    monkeypatch.setenv("BROKER_CLOCK_EPOCH", epoch.isoformat())
    monkeypatch.setenv("BROKER_CLOCK_SCHEDULE", str(tmp_path / "absent"))
    fixed = clock.get_clock()
    assert isinstance(fixed, ScaledClock) and clock.scale() == 600.0
    elapsed = (clock.now() - epoch).total_seconds()
    assert elapsed == pytest.approx(60_000, abs=60)

    clock.set_clock(None)
    start_schedule(tmp_path / "absent", 600.0, epoch)
    scheduled = clock.get_clock()
    assert isinstance(scheduled, ScheduleClock)
    assert abs(scheduled.now() - ScaledClock(600.0, epoch).now()) < timedelta(seconds=5)
    # Lowered: spans sized to ride out wall-time hiccups (leases) keep the starting scale.
    lower_scale(tmp_path / "absent", 150.0, lead_seconds=0.0)
    time.sleep(0.6)
    assert clock.scale() == 150.0 and clock.nominal_scale() == 600.0


def test_a_restarted_schedule_goes_on_from_where_time_was(tmp_path: Path) -> None:
    path, epoch = tmp_path / "clock_schedule", datetime.now(UTC) - timedelta(seconds=10)
    start_schedule(path, 900.0, epoch)
    lower_scale(path, 450.0, lead_seconds=0.0)
    before = ScheduleClock(path).now()
    segments = start_schedule(path, 900.0, epoch)  # the same data folder, a new run
    assert len(segments) == 3 and segments[-1][2] == 900.0
    assert ScheduleClock(path).now() - before < timedelta(seconds=30)

    other = start_schedule(path, 900.0, epoch - timedelta(days=1))  # another epoch: anew
    assert len(other) == 1
