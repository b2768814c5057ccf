"""Fault injection for the local clouds: a seeded fraction of calls fail or stall."""

from __future__ import annotations

import random
import threading
from collections import Counter
from enum import StrEnum


class Fault(StrEnum):
    """What an injected fault does to one API call."""

    THROTTLE = "throttle"  # EC2 RequestLimitExceeded (503) / GCE 429 rateLimitExceeded
    SERVER_ERROR = "server_error"  # 500
    UNAVAILABLE = "unavailable"  # 503
    DELAY = "delay"  # answered normally, after ``delay_seconds``


class FaultInjector:
    """Decides, call by call, whether a local cloud misbehaves (deterministic for a seed).

    ``rate`` and ``kinds`` may be changed while the servers run; ``fail_next`` queues
    faults that are served before any random ones.
    """

    def __init__(
        self,
        rate: float = 0.0,
        *,
        seed: int = 0,
        kinds: tuple[Fault, ...] = tuple(Fault),
        delay_seconds: float = 0.05,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError("fault rate must be within [0, 1]")
        self.rate = rate
        self.kinds = kinds
        self.delay_seconds = delay_seconds
        self.injected: Counter[Fault] = Counter()
        self._random = random.Random(seed)
        self._queued: list[Fault] = []
        self._lock = threading.Lock()

    def fail_next(self, count: int, kind: Fault = Fault.THROTTLE) -> None:
        """Make the next ``count`` calls fail with ``kind`` whatever the rate."""
        with self._lock:
            self._queued.extend([kind] * count)

    def reset(self, rate: float = 0.0) -> None:
        """Drop queued faults, zero the counters and set a new rate."""
        with self._lock:
            self._queued.clear()
            self.injected.clear()
            self.rate = rate

    def decide(self) -> Fault | None:
        """The fault for the call being served now, or None to answer it normally."""
        with self._lock:
            if self._queued:
                fault = self._queued.pop(0)
            elif self.rate > 0 and self.kinds and self._random.random() < self.rate:
                fault = self._random.choice(self.kinds)
            else:
                return None
            self.injected[fault] += 1
            return fault

    @property
    def total_injected(self) -> int:
        """How many calls were answered with a fault so far."""
        with self._lock:
            return sum(self.injected.values())
