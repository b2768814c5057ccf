"""The broker's clock: every reading of the time goes through here.

A scaled clock runs ``scale`` simulated seconds per wall second from a shared epoch, so
that the API, workers, beat and local clouds agree on "now" while hours pass in seconds.
A schedule clock does the same from a shared, append-only schedule file whose segments
``(wall_start, broker_start, scale)`` each continue the last: the embedded stack appends one,
a little ahead of time, to lower the scale while every process keeps agreeing on "now".
"""

from __future__ import annotations

import math
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

# How often a process looks for a new segment (a stat), and how far ahead a change is
# announced: every reader has switched before a new segment takes effect.
SCHEDULE_RECHECK_SECONDS = 0.5
SCALE_CHANGE_LEAD_SECONDS = 1.0

Segment = tuple[float, float, float]  # wall_start, broker_start (Unix seconds), scale


class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime: ...


class RealClock:
    """Wall-clock time."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ScaledClock:
    """Simulated time: ``epoch + (wall - epoch) * scale``; processes sharing epoch agree."""

    def __init__(self, scale: float, epoch: datetime) -> None:
        if scale <= 0:
            raise ValueError("scale must be positive")
        if epoch.tzinfo is None:
            raise ValueError("epoch must be timezone-aware")
        self.scale = scale
        self.epoch = epoch.astimezone(UTC)
        self._epoch_ts = self.epoch.timestamp()

    def now(self) -> datetime:
        elapsed = (time.time() - self._epoch_ts) * self.scale
        return self.epoch + timedelta(seconds=elapsed)

    def wall_seconds(self, simulated_seconds: float) -> float:
        """How many wall seconds a span of simulated time takes."""
        return simulated_seconds / self.scale


def read_schedule(path: Path) -> list[Segment]:
    """The segments of a schedule file; a last line still being written is left out."""
    segments: list[Segment] = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        wall, broker, scale = (float(part) for part in line.split())
        if not scale > 0:
            raise ValueError(f"{path}: scale must be positive, got {scale}")
        segments.append((wall, broker, scale))
    if not segments:
        raise ValueError(f"{path}: no clock segment")
    return segments


def segment_at(segments: list[Segment], wall: float) -> Segment:
    """The segment in force at a wall time (the first one before it starts)."""
    current = segments[0]
    for segment in segments[1:]:
        if segment[0] > wall:
            break
        current = segment
    return current


def broker_seconds(segments: list[Segment], wall: float) -> float:
    """Broker time (Unix seconds) at a wall time."""
    wall_start, broker_start, scale = segment_at(segments, wall)
    return broker_start + (wall - wall_start) * scale


def _line(segment: Segment) -> str:
    return " ".join(repr(float(value)) for value in segment) + "\n"


def start_schedule(path: Path, scale: float, epoch: datetime) -> list[Segment]:
    """Make ``path`` a schedule from ``epoch`` at ``scale``. A schedule from the same epoch
    goes on from its current time at ``scale`` (a restarted stack keeps time moving on)."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    start = epoch.timestamp()
    try:
        segments = read_schedule(path)
    except (OSError, ValueError):
        segments = []
    if segments and segments[0][:2] == (start, start):
        wall = time.time()
        segments.append((wall, broker_seconds(segments, wall), scale))
    else:
        segments = [(start, start, scale)]
    temporary = path.with_name(path.name + ".new")
    temporary.write_text("".join(map(_line, segments)))
    os.replace(temporary, path)
    return segments


def lower_scale(
    path: Path,
    scale: float,
    lead_seconds: float = SCALE_CHANGE_LEAD_SECONDS,
    now: float | None = None,
) -> Segment:
    """Append a segment running at ``scale`` from ``lead_seconds`` after ``now`` (wall,
    default: the current time), continuing broker time where the schedule has it then."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    segments = read_schedule(path)
    wall = max((time.time() if now is None else now) + lead_seconds, segments[-1][0])
    segment = (wall, broker_seconds(segments, wall), scale)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, _line(segment).encode())  # one write: readers see all of it or none
    finally:
        os.close(fd)
    return segment


class ScheduleClock:
    """Broker time from a schedule file, looked at again at most every half second; never
    goes back in this process, even if it saw a change late."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._segments = read_schedule(self.path)
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        self._last = -math.inf

    def _file_stamp(self) -> tuple[int, int]:
        status = os.stat(self.path)
        return status.st_mtime_ns, status.st_size

    def segments(self) -> list[Segment]:
        """The schedule as this process knows it (re-read when the file changed)."""
        with self._lock:
            if time.monotonic() - self._checked >= SCHEDULE_RECHECK_SECONDS:
                self._checked = time.monotonic()
                try:
                    stamp = self._file_stamp()
                    if stamp != self._stamp:
                        self._segments, self._stamp = read_schedule(self.path), stamp
                except (OSError, ValueError):
                    pass  # keep the last good schedule
            return self._segments

    def now(self) -> datetime:
        segments = self.segments()
        seconds = broker_seconds(segments, time.time())
        with self._lock:
            seconds = self._last = max(seconds, self._last)
        return datetime.fromtimestamp(seconds, UTC)

    @property
    def scale(self) -> float:
        """Broker seconds per wall second now."""
        return segment_at(self.segments(), time.time())[2]

    @property
    def epoch(self) -> datetime:
        """Where the schedule starts (wall and broker time agree there)."""
        return datetime.fromtimestamp(self.segments()[0][0], UTC)

    def wall_seconds(self, simulated_seconds: float) -> float:
        """How many wall seconds a span of simulated time takes at the current scale."""
        return simulated_seconds / self.scale


class ManualClock:
    """A clock that moves only when told to (tests, the simulator)."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment.astimezone(UTC)


_clock: Clock | None = None


def get_clock() -> Clock:
    """The process-wide clock, built from settings on first use."""
    global _clock
    if _clock is None:
        from broker.settings import get_settings

        settings = get_settings()
        schedule = settings.clock_schedule
        if schedule is not None and schedule.exists():
            _clock = ScheduleClock(schedule)
        elif settings.clock_scale == 1.0 and settings.clock_epoch is None:
            _clock = RealClock()
        else:
            epoch = settings.clock_epoch or datetime.now(UTC)
            _clock = ScaledClock(settings.clock_scale, epoch)
    return _clock


def set_clock(clock: Clock | None) -> None:
    """Replace the process-wide clock (None: rebuild from settings on next use)."""
    global _clock
    _clock = clock


def now() -> datetime:
    """The broker's current time, aware UTC."""
    return get_clock().now()


def scale() -> float:
    """Simulated seconds per wall second of the process-wide clock (1 for the real clock)."""
    return float(getattr(get_clock(), "scale", 1.0))


def nominal_scale() -> float:
    """The scale the clock started at (settings' ``clock_scale``), or the current one when
    higher. Spans that must ride out wall-time hiccups (a spend lease, its renewal window)
    are sized with it: after the embedded stack lowers the scale they keep their broker
    length, and so last longer in wall time, as a lagging loop needs."""
    from broker.settings import get_settings

    return max(scale(), get_settings().clock_scale)
