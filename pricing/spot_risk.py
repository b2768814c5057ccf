"""Spot preemption rates estimated from availability traces.

A preemption is a tick where spot goes from available to unavailable; its rate is those
transitions per hour of availability (the hours an instance could have been running).
Rates are pooled per (region, GPU); every other pair gets the median per-trace rate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import numpy as np

from pricing.traces import Trace, bundled_traces

_ZONE = re.compile(r"^(?P<region>.*\d)[a-z]$")


def trace_region(zone: str) -> str:
    """Region of an AWS zone name (``us-east-1a`` -> ``us-east-1``); other names unchanged."""
    match = _ZONE.match(zone)
    return match["region"] if match else zone


def preemptions(trace: Trace) -> int:
    """Number of available -> unavailable transitions in a trace."""
    available = trace.available
    return int(np.count_nonzero(available[:-1] & ~available[1:]))


def available_hours(trace: Trace) -> float:
    """Hours during which spot was available."""
    return float(np.count_nonzero(trace.available)) * trace.gap_seconds / 3600.0


def availability(trace: Trace) -> float:
    """Fraction of ticks at which spot was available."""
    return float(np.mean(trace.available)) if len(trace.available) else 0.0


def preemption_rate(trace: Trace) -> float:
    """Preemptions per available hour of one trace (0 if never available)."""
    hours = available_hours(trace)
    return preemptions(trace) / hours if hours > 0 else 0.0


@dataclass(frozen=True)
class SpotRiskModel:
    """Preemptions per hour by (region, GPU), and the rate used where no trace exists."""

    rates: dict[tuple[str, str], float]
    default_rate: float

    def rate(self, region: str, gpu: str) -> float:
        """Rate for one pair, falling back to the default."""
        return self.rates.get((region, gpu), self.default_rate)

    def rates_for(self, region: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        """Rates for aligned region and GPU arrays (one lookup per distinct pair)."""
        if len(region) == 0:
            return np.zeros(0)
        keys = np.char.add(np.char.add(region.astype(str), "\x1f"), gpu.astype(str))
        unique, inverse = np.unique(keys, return_inverse=True)
        values = np.array([self.rate(*str(k).split("\x1f", 1)) for k in unique])
        return values[inverse.reshape(-1)]


def estimate(traces: Iterable[Trace]) -> SpotRiskModel:
    """Pool traces per (region, GPU); default = median of the per-trace rates."""
    counts: dict[tuple[str, str], int] = {}
    hours: dict[tuple[str, str], float] = {}
    per_trace = []
    for trace in traces:
        key = (trace_region(trace.zone), trace.gpu)
        counts[key] = counts.get(key, 0) + preemptions(trace)
        hours[key] = hours.get(key, 0.0) + available_hours(trace)
        per_trace.append(preemption_rate(trace))
    rates = {key: counts[key] / hours[key] for key in counts if hours[key] > 0}
    default = float(np.median(per_trace)) if per_trace else 0.0
    return SpotRiskModel(rates=rates, default_rate=default)


def availability_by_trace(traces: Iterable[Trace]) -> dict[str, float]:
    """Availability fraction of every trace, by trace name."""
    return {trace.name: availability(trace) for trace in traces}


@cache
def bundled_risk_model() -> SpotRiskModel:
    """The model estimated from the traces shipped with the package."""
    return estimate(bundled_traces())
