"""A job on a trace's clock: its work, deadline and restart overhead in ticks, and its windows.

The model every simulation and the hindsight optimum share (see :mod:`broker.sim.simulator`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from broker.core.reservation import reservation
from pricing.traces import Trace


@dataclass(frozen=True)
class TraceJob:
    """One job: work and deadline in hours from its start, restart overhead, prices, and the
    reservation its policy's budget net keeps spend within (None: the one the broker makes,
    ``broker.core.reservation``; ``math.inf``: no budget net)."""

    work_hours: float
    deadline_hours: float
    restart_hours: float
    spot_price: float
    on_demand_price: float
    reserved: float | None = None


@dataclass(frozen=True)
class Ticks:
    """A ``TraceJob`` on a trace's clock."""

    hours: float  # one tick
    work: int
    deadline: int
    restart: int

    @classmethod
    def of(cls, job: TraceJob, gap_seconds: float) -> Ticks:
        tick = gap_seconds / 3600.0
        return cls(
            hours=tick,
            work=math.ceil(job.work_hours / tick - 1e-9),
            deadline=math.floor(job.deadline_hours / tick + 1e-9),
            restart=math.ceil(job.restart_hours / tick - 1e-9),
        )


def reserved(job: TraceJob, ticks: Ticks) -> float:
    """What the job may spend ($): ``job.reserved``, or the broker's reservation for it."""
    if job.reserved is not None:
        return job.reserved
    return reservation(
        "auto",
        on_demand_price=job.on_demand_price,
        work_hours=ticks.work * ticks.hours,
        restart_hours=ticks.restart * ticks.hours,
        tick_hours=ticks.hours,
        max_cost=math.inf,
    )


def zone_matrix(traces: Sequence[Trace]) -> tuple[np.ndarray, float]:
    """Zones of one region as a (Z, L) availability matrix and its tick in seconds."""
    gaps = {t.gap_seconds for t in traces}
    lengths = {len(t.available) for t in traces}
    if len(gaps) != 1 or len(lengths) != 1:
        raise ValueError("traces of one simulation need the same gap_seconds and length")
    return np.stack([t.available for t in traces]), gaps.pop()


def start_offsets(trace_ticks: int, starts: int) -> np.ndarray:
    """``starts`` job start offsets spread evenly over the trace."""
    return (np.arange(starts) * trace_ticks) // starts


def job_windows(available: np.ndarray, offsets: np.ndarray, ticks: int) -> np.ndarray:
    """(Z, B, ticks) availability seen by each job from its start offset (wrapping)."""
    index = (offsets[:, None] + np.arange(ticks)[None, :]) % available.shape[1]
    return available[:, index]


def on_demand_cost(job: TraceJob, gap_seconds: float) -> float:
    """What the job costs on on-demand alone (one start)."""
    ticks = Ticks.of(job, gap_seconds)
    return (ticks.work + ticks.restart) * ticks.hours * job.on_demand_price
