"""What the simulated broker knows before a job starts: the zones' past and its plan.

The live broker keeps ``policy.HISTORY_DAYS`` of what it saw of each zone; the simulator
gives each job the ``HISTORY_HOURS`` of the trace before its start, and only that: history
never wraps around the trace, so a start with less past than that gets what there is (at the
trace's first tick, none). Jobs themselves wrap (one near a trace's end runs on into its
beginning), so the history of such a start is also cut short of the ticks its job wraps
onto: no job ever sees its own future. The ``broker`` policy's spot model is refitted once a
simulated day, from the history before that day, and every job starting that day plans on
it. Its prior (``fleet``: every zone and instance type the broker watched) is taken from the
same past ticks only; where the job's zones have little past, the chain leans on the fleet's
hazards (``spot_chain.fit_chain``), as live. ``prior``, runs recorded before the trace began,
plays the part the bundled traces' runs play live (``broker.core.spot_model.combine``): they
come first in the runs of the job's zones and of the fleet, so a start with no past at all
plans on them (without them, on the chain's defaults).

In the simulator's observed view (``simulator``), this history is still every zone's, up to
the start: the choice made is that the broker's other jobs and its watching of the fleet
(live: its recorded attempts and the bundled traces) saw each zone until the job starts, so
a job begins with each zone's statistics and last known state; from the start on, a zone's
history advances only on the ticks this job observes it. This is an optimistic bound on
what a live broker knows at a start (a zone no job ran in lately is known only as of then),
and the spot model's plan (``start_plans``) is likewise fitted on every zone's past.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from broker.core.policy import HISTORY_DAYS
from broker.core.spot_chain import SpotChain, fit_chain, run_lengths
from broker.core.spot_mdp import SpotPlan, plan_step_hours, solve_hours

if TYPE_CHECKING:
    from broker.sim.scenario import Ticks, TraceJob

Runs = tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]  # windows, outages (h)

HISTORY_HOURS = HISTORY_DAYS * 24.0  # what the broker has seen of each zone before a start
REFIT_HOURS = 24.0  # how often the spot model is refitted


def history_start(
    length: int, ends: np.ndarray, tick_hours: float, reach: np.ndarray | int
) -> np.ndarray:
    """First tick of the history before each of ``ends`` (it runs up to the tick before):
    ``HISTORY_HOURS`` back at most, never before the trace's first tick, nor on the ticks a
    job running ``reach`` ticks from ``ends`` wraps onto. Empty (= ``ends``) when no past."""
    ends = np.asarray(ends, dtype=np.int64)
    back = ends - int(HISTORY_HOURS / tick_hours + 1e-9)
    wrapped = ends + np.asarray(reach, dtype=np.int64) - length  # ticks past the trace's end
    return np.clip(np.maximum(back, wrapped), 0, ends)


def prime_history(
    available: np.ndarray, offsets: np.ndarray, tick_hours: float, horizon: int
) -> tuple[np.ndarray, ...]:
    """History arrays (observed, available hours, windows, last, age hours), each (Z, B), of
    the history before each start, for jobs that run at most ``horizon`` ticks."""
    n_zones, length = available.shape
    ends = np.asarray(offsets, dtype=np.int64)
    lo = history_start(length, ends, tick_hours, horizon)
    has = ends > lo
    seen = np.zeros((n_zones, length + 1), np.int64)
    np.cumsum(available, axis=1, out=seen[:, 1:])
    rises = np.zeros((n_zones, length + 1), np.int64)
    np.cumsum(available[:, 1:] & ~available[:, :-1], axis=1, out=rises[:, 2:])
    first = np.minimum(lo, length - 1)
    # windows begun in the history: its first tick if available, then every rise after it
    windows = available[:, first] * has + rises[:, ends] - rises[:, np.minimum(lo + 1, ends)]
    last_tick = np.maximum(ends - 1, 0)
    last = available[:, last_tick] & has
    # how long each zone's last state has lasted (within the history)
    change = np.ones((n_zones, length), bool)
    change[:, 1:] = available[:, 1:] != available[:, :-1]
    began = np.maximum.accumulate(np.where(change, np.arange(length), 0), axis=1)
    age = np.where(has, ends - np.maximum(began[:, last_tick], lo), 0) * tick_hours
    observed = np.broadcast_to((ends - lo) * tick_hours, (n_zones, len(ends)))
    return (
        observed.astype(float),
        (seen[:, ends] - seen[:, lo]) * tick_hours,
        windows.astype(float),
        last,
        age.astype(float),
    )


def start_plans(
    available: np.ndarray,
    offsets: np.ndarray,
    tick_hours: float,
    runs: Sequence[tuple[Ticks, TraceJob]],
    fleet: np.ndarray | None = None,
    prior: Runs | None = None,
) -> tuple[tuple[SpotPlan, ...], np.ndarray]:
    """One plan per run, with one chain per simulated day; and each start's day (its row).

    The chain is fitted to spot in any of the zones (a job may use whichever has it) over the
    history before the day, its hazards shrunk towards those of ``fleet`` ((Z', L)
    availability of every zone and instance type the broker watched, each on its own) over
    the same ticks, when given; ``prior`` (window and outage hours seen before the trace)
    comes before both.
    """
    length = available.shape[1]
    day = max(1, round(REFIT_HOURS / tick_hours))
    days, rows = np.unique(offsets // day, return_inverse=True)
    # from a day's start to its last job's start: history must not wrap into any of its jobs
    span: np.ndarray = np.zeros(len(days), np.int64)  # its items go in as ticks (ints)
    np.maximum.at(span, rows, offsets - (offsets // day) * day)
    union = cast(np.ndarray, available.any(axis=0))  # (Z, T) -> (T,): always an array
    chains: dict[tuple[float, int], list[SpotChain]] = {}
    plans = []
    for ticks, job in runs:
        unit = ticks.part_hours
        step = plan_step_hours(tick_hours, ticks.deadline * unit)
        if (step, ticks.span) not in chains:
            ends = days * day
            starts = history_start(length, ends, tick_hours, span + ticks.span)
            chains[(step, ticks.span)] = [
                _fit(union, fleet, prior, int(lo), int(end), tick_hours, step)
                for lo, end in zip(starts, ends, strict=True)
            ]
        plans.append(
            solve_hours(
                chains[(step, ticks.span)],
                ticks.work * unit,
                ticks.deadline * unit,
                ticks.restart * unit,
                job.spot_price,
                job.on_demand_price,
            )
        )
    return tuple(plans), rows


def _fit(
    union: np.ndarray,
    fleet: np.ndarray | None,
    prior: Runs | None,
    lo: int,
    end: int,
    tick_hours: float,
    step: float,
) -> SpotChain:
    """The chain of ``union``'s ticks [lo, end), with the fleet's there as its prior; the
    runs of ``prior`` first in both."""
    first = [prior] if prior is not None else []
    own = first + [run_lengths(union[lo:end], tick_hours)]
    watched = None
    if fleet is not None or prior is not None:
        seen = first + [
            run_lengths(zone[lo:end], tick_hours) for zone in (fleet if fleet is not None else ())
        ]
        watched = _joined(seen)
    return fit_chain(*_joined(own), step, fleet=watched)


def _joined(runs: list[Runs]) -> tuple[np.ndarray, np.ndarray]:
    up = [np.asarray(u, dtype=float) for u, _ in runs]
    down = [np.asarray(d, dtype=float) for _, d in runs]
    return np.concatenate(up), np.concatenate(down)
