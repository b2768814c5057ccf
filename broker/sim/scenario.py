"""A job on a trace's clock: its work, deadline and restart overhead in parts of a tick, and
its windows.

The model every simulation and the hindsight optimum share (see :mod:`broker.sim.simulator`).
A tick is split into the fewest equal parts (at most ``MAX_PARTS``) that make the work, the
deadline and the restart overhead whole numbers of parts, so they are kept exactly: a 0.2 h
restart on 600 s ticks is 6 parts of a fifth of a tick (0.2 h), not 2 ticks (0.333 h).
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
    ``broker.core.reservation``; ``math.inf``: no budget net). ``max_cost``: the most that
    reservation may grow to when the net asks to hold more (``policy.Decision.hold``; live,
    within the job's max_cost and its team's free budget, here always granted); None:
    the reservation alone."""

    work_hours: float
    deadline_hours: float
    restart_hours: float
    spot_price: float
    on_demand_price: float
    reserved: float | None = None
    max_cost: float | None = None


MAX_PARTS = 60  # the finest split of a tick (the hindsight optimum's work grows with it)


@dataclass(frozen=True)
class Ticks:
    """A ``TraceJob`` on a trace's clock: work, deadline and restart in parts of a tick."""

    hours: float  # one tick
    parts: int  # parts in a tick
    work: int  # parts
    deadline: int
    restart: int

    @classmethod
    def of(cls, job: TraceJob, gap_seconds: float) -> Ticks:
        """Exact when some split of the tick into at most ``MAX_PARTS`` parts fits all three;
        else in ``MAX_PARTS`` parts, work and restart rounded up and the deadline down (so the
        model never flatters a policy)."""
        tick = gap_seconds / 3600.0
        hours = (job.work_hours, job.deadline_hours, job.restart_hours)
        parts = next(
            (p for p in range(1, MAX_PARTS + 1) if all(_whole(h / tick * p) for h in hours)),
            MAX_PARTS,
        )
        unit = tick / parts
        return cls(
            hours=tick,
            parts=parts,
            work=math.ceil(job.work_hours / unit - 1e-9),
            deadline=math.floor(job.deadline_hours / unit + 1e-9),
            restart=math.ceil(job.restart_hours / unit - 1e-9),
        )

    @property
    def part_hours(self) -> float:
        return self.hours / self.parts

    @property
    def span(self) -> int:
        """Ticks from the start to the deadline (the last one perhaps only in part)."""
        return -(-self.deadline // self.parts)


def _whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-6


def reserved(job: TraceJob, ticks: Ticks) -> float:
    """What the job may spend ($): ``job.max_cost`` (what the net's holds may reach),
    ``job.reserved``, or the broker's reservation for it."""
    if job.max_cost is not None:
        return job.max_cost
    if job.reserved is not None:
        return job.reserved
    return reservation(
        "auto",
        on_demand_price=job.on_demand_price,
        work_hours=ticks.work * ticks.part_hours,
        restart_hours=ticks.restart * ticks.part_hours,
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
    return (ticks.work + ticks.restart) * ticks.part_hours * job.on_demand_price
