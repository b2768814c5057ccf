"""Market replay: spot availability per (provider, zone, GPU) follows real traces.

The local clouds ask ``is_available`` when a spot launch arrives and register a
preemptor that ``step()`` (or the background thread) calls to take spot instances
back in zones that just became unavailable. Time is the broker's clock.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from broker import clock as broker_clock
from broker.clock import Clock
from pricing.traces import Trace, bundled_traces

logger = logging.getLogger(__name__)

ANY_GPU = "*"
MarketKey = tuple[str, str, str]  # (provider, zone, GPU catalog name or ANY_GPU)
Preemptor = Callable[["MarketReplay"], int]


def _key(provider: str, zone: str, gpu: str) -> MarketKey:
    return (provider.lower(), zone, gpu if gpu == ANY_GPU else gpu.upper())


def default_assignments(
    traces: Iterable[Trace] | None = None,
    *,
    aws_zones: Iterable[str] = (),
    gcp_zones: Iterable[str] = (),
) -> dict[MarketKey, Trace]:
    """Which trace drives which zone, by default.

    AWS zones named in the traces follow their own trace (per GPU, single-node and
    longest first; any other GPU follows the zone's V100 trace). Other AWS zones and
    the GCP zones get the traces round-robin, so every zone has a real pattern.
    """
    best: dict[tuple[str, str], Trace] = {}
    for trace in traces if traces is not None else bundled_traces():
        slot = (trace.zone, trace.gpu)
        rank = (trace.gpu_count == 1, trace.hours)
        if slot not in best or rank > (best[slot].gpu_count == 1, best[slot].hours):
            best[slot] = trace
    assignments: dict[MarketKey, Trace] = {}
    per_zone: dict[str, Trace] = {}
    for (zone, gpu), trace in sorted(best.items()):
        assignments[_key("aws", zone, gpu)] = trace
        if zone not in per_zone or gpu == "V100":
            per_zone[zone] = trace
    for zone, trace in per_zone.items():
        assignments[_key("aws", zone, ANY_GPU)] = trace
    primary = [per_zone[zone] for zone in sorted(per_zone)]
    if not primary:
        return assignments
    spare = itertools.cycle(primary)
    for zone in aws_zones:
        if zone not in per_zone:
            assignments[_key("aws", zone, ANY_GPU)] = next(spare)
    for zone, trace in zip(gcp_zones, itertools.cycle(primary), strict=False):
        assignments[_key("gcp", zone, ANY_GPU)] = trace
    return assignments


class MarketReplay:
    """Spot availability replayed from traces on the broker's clock, with test overrides."""

    def __init__(
        self,
        assignments: Mapping[MarketKey, Trace],
        *,
        offset_seconds: float = 0.0,
        start: datetime | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.assignments = {_key(*k): t for k, t in assignments.items()}
        self.offset_seconds = offset_seconds
        self._clock = clock
        self.start_time = start or self.now()
        self._overrides: dict[MarketKey, bool] = {}
        self._preemptors: list[Preemptor] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def default(
        cls, *, aws_zones: Iterable[str] = (), gcp_zones: Iterable[str] = (), **options: object
    ) -> MarketReplay:
        """A replay of the bundled traces with the default zone mapping."""
        assignments = default_assignments(aws_zones=aws_zones, gcp_zones=gcp_zones)
        return cls(assignments, **options)  # type: ignore[arg-type]

    def now(self) -> datetime:
        """The market's time: the given clock, else the broker's."""
        return self._clock.now() if self._clock else broker_clock.now()

    def position_seconds(self, at: datetime | None = None) -> float:
        """Seconds into the traces at ``at`` (default now)."""
        return ((at or self.now()) - self.start_time).total_seconds() + self.offset_seconds

    def trace_for(self, provider: str, zone: str, gpu: str) -> Trace | None:
        """The trace that drives this (provider, zone, GPU), if any."""
        return self.assignments.get(_key(provider, zone, gpu)) or self.assignments.get(
            _key(provider, zone, ANY_GPU)
        )

    def is_available(self, provider: str, zone: str, gpu: str) -> bool:
        """Whether a spot launch of ``gpu`` in ``zone`` would get capacity now."""
        with self._lock:
            for key in (_key(provider, zone, gpu), _key(provider, zone, ANY_GPU)):
                if key in self._overrides:
                    return self._overrides[key]
        trace = self.trace_for(provider, zone, gpu)
        return True if trace is None else trace.available_at(self.position_seconds())

    def set_available(self, provider: str, zone: str, gpu: str, available: bool | None) -> None:
        """Force availability (``gpu="*"``: every GPU of the zone); None goes back to the trace."""
        with self._lock:
            if available is None:
                self._overrides.pop(_key(provider, zone, gpu), None)
            else:
                self._overrides[_key(provider, zone, gpu)] = available

    def clear_overrides(self) -> None:
        """Every zone follows its trace again."""
        with self._lock:
            self._overrides.clear()

    def attach(self, preemptor: Preemptor) -> None:
        """Register a cloud's "take back spot instances where unavailable" callback."""
        self._preemptors.append(preemptor)

    def step(self) -> int:
        """Preempt every running spot instance in a zone that is unavailable now."""
        preempted = 0
        for preemptor in list(self._preemptors):
            try:
                preempted += preemptor(self)
            except Exception:  # a broken cloud must not stop the replay of the others
                logger.exception("market preemptor failed")
        return preempted

    def start(self, interval_seconds: float = 1.0) -> None:
        """Call ``step()`` every ``interval_seconds`` of wall time in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_seconds):
                self.step()

        self._thread = threading.Thread(target=loop, name="market-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (no-op if it was never started)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
