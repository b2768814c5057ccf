"""The broker's clock: every reading of the time goes through here.

A scaled clock runs ``scale`` simulated seconds per wall second from a shared epoch, so
that the API, workers, beat and local clouds agree on "now" while hours pass in seconds.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


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
        if settings.clock_scale == 1.0 and settings.clock_epoch is None:
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
