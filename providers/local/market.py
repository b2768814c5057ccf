"""Market replay: spot availability per (provider, zone, GPU) follows real traces, and
prices move when a test or the demo says so.

The local clouds ask ``is_available`` when a spot launch arrives and register a
preemptor that ``step()`` (or the background thread) calls to take spot instances
back in zones that just became unavailable. Prices are the bundled catalog's unless
``set_price`` (now) or ``stage_price`` (at a given time) changed them; the local pricing
APIs serve ``price_changes()`` over the catalog. Time is the broker's clock.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from broker import clock as broker_clock
from broker.clock import Clock
from pricing.traces import Trace, bundled_traces

logger = logging.getLogger(__name__)

ANY_GPU = "*"
MarketKey = tuple[str, str, str]  # (provider, zone, GPU catalog name or ANY_GPU)
Preemptor = Callable[["MarketReplay"], int]


MARKETS = ("spot", "on_demand")


@dataclass(frozen=True)
class PriceChange:
    """From ``effective_at`` on, one offer's price in one market is ``micros_per_hour``
    (``-1``: that market is no longer offered). ``zone`` as the catalog names it (AWS zone
    id such as ``use1-az2``, or the zone name; GCP zone name); ``gpu`` narrows a GCP N1
    host to the GPU it carries (empty: every GPU)."""

    provider: str
    zone: str
    instance_type: str
    market: str
    micros_per_hour: int
    effective_at: datetime
    gpu: str = ""


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
        self._price_changes: list[PriceChange] = []
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
        """Every zone follows its trace again, and every price is the catalog's again."""
        with self._lock:
            self._overrides.clear()
            self._price_changes.clear()

    def set_price(
        self,
        provider: str,
        zone: str,
        instance_type: str,
        market: str,
        micros_per_hour: int,
        *,
        gpu: str = "",
    ) -> None:
        """Change an offer's price in ``market`` ("spot" or "on_demand") now."""
        now = self.now()
        self.stage_price(now, provider, zone, instance_type, market, micros_per_hour, gpu=gpu)

    def stage_price(
        self,
        at: datetime,
        provider: str,
        zone: str,
        instance_type: str,
        market: str,
        micros_per_hour: int,
        *,
        gpu: str = "",
    ) -> None:
        """Change an offer's price in ``market`` once the market's clock passes ``at``."""
        if market not in MARKETS:
            raise ValueError(f"market must be one of {MARKETS}, not {market!r}")
        change = PriceChange(
            provider.lower(), zone, instance_type, market, int(micros_per_hour), at, gpu.upper()
        )
        with self._lock:
            self._price_changes.append(change)

    def price_changes(self, provider: str | None = None) -> list[PriceChange]:
        """The changes in effect by now (staged ones whose time has come), oldest first
        (by time, then in the order given): apply them in order over the catalog."""
        now = self.now()
        with self._lock:
            changes = [
                c
                for c in self._price_changes
                if c.effective_at <= now and (provider is None or c.provider == provider.lower())
            ]
        return sorted(changes, key=lambda c: c.effective_at)  # stable: ties keep their order

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
