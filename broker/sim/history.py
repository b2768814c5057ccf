"""What the simulated broker knows before a job starts: the zones' recent history and its plan.

The live broker keeps ``policy.HISTORY_DAYS`` of what it saw of each zone; the simulator
gives each job the ``HISTORY_HOURS`` of the trace before its start. Traces wrap (a job near
a trace's end runs on into its beginning), so a start early in a trace takes its history
from the trace's end, as if the trace repeated; the history is cut short where it would
reach the ticks the job itself may run on, so no job ever sees its own future. The
``broker`` policy's spot model is refitted once a simulated day, from the history before
that day, and every job starting that day plans on it.
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

HISTORY_HOURS = HISTORY_DAYS * 24.0  # what the broker has seen of each zone before a start
REFIT_HOURS = 24.0  # how often the spot model is refitted


def history_ticks(length: int, tick_hours: float, reach: int) -> int:
    """Ticks of history before a start: ``HISTORY_HOURS``, less any that would wrap into the
    ``reach`` ticks from the start on (what the job may run on); at least one."""
    return max(1, min(int(HISTORY_HOURS / tick_hours), length - reach))


def _history_index(length: int, ends: np.ndarray, n: int) -> np.ndarray:
    return (np.asarray(ends)[..., None] - n + np.arange(n)) % length


def prime_history(
    available: np.ndarray, offsets: np.ndarray, tick_hours: float, horizon: int
) -> tuple[np.ndarray, ...]:
    """History arrays (observed, available hours, windows, last, age hours) of the history
    before each start, for jobs that run at most ``horizon`` ticks."""
    n = history_ticks(available.shape[1], tick_hours, horizon)
    seen = available[:, _history_index(available.shape[1], offsets, n)]  # (Z, B, n)
    rises = seen[..., 1:] & ~seen[..., :-1]
    windows = rises.sum(axis=2) + seen[..., 0]
    observed = np.full(seen.shape[:2], seen.shape[2] * tick_hours)
    # how long each zone's last state has lasted (within the history)
    same = (seen == seen[..., -1:])[..., ::-1]
    age = np.where(same.all(axis=2), same.shape[2], same.argmin(axis=2)) * tick_hours
    return (
        observed,
        seen.sum(axis=2) * tick_hours,
        windows.astype(float),
        seen[..., -1].copy(),
        age,
    )


def start_plans(
    available: np.ndarray,
    offsets: np.ndarray,
    tick_hours: float,
    runs: Sequence[tuple[Ticks, TraceJob]],
    fleet: np.ndarray | None = None,
) -> tuple[tuple[SpotPlan, ...], np.ndarray]:
    """One plan per run, with one chain per simulated day; and each start's day (its row).

    The chain is fitted to spot in any of the zones (a job may use whichever has it), its
    hazards shrunk towards those of ``fleet`` ((Z', L) availability of every zone and
    instance type the broker watched over the same ticks, each on its own) when given.
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
        step = plan_step_hours(tick_hours, ticks.deadline * tick_hours)
        if (step, ticks.deadline) not in chains:
            chains[(step, ticks.deadline)] = [
                _fit(union, fleet, _history_index(length, end, n), tick_hours, step)
                for end, n in zip(
                    days * day,
                    (history_ticks(length, tick_hours, s + ticks.deadline) for s in span),
                    strict=True,
                )
            ]
        plans.append(
            solve_hours(
                chains[(step, ticks.deadline)],
                ticks.work * tick_hours,
                ticks.deadline * tick_hours,
                ticks.restart * tick_hours,
                job.spot_price,
                job.on_demand_price,
            )
        )
    return tuple(plans), rows


def _fit(
    union: np.ndarray, fleet: np.ndarray | None, index: np.ndarray, tick_hours: float, step: float
) -> SpotChain:
    """The chain of ``union``'s history at ``index``, with the fleet's there as its prior."""
    prior = None
    if fleet is not None:
        seen = [run_lengths(zone[index], tick_hours) for zone in fleet]
        prior = (np.concatenate([up for up, _ in seen]), np.concatenate([d for _, d in seen]))
    return fit_chain(*run_lengths(union[index], tick_hours), step, fleet=prior)
