"""What the simulated broker knows before a job starts: the zones' recent history and its plan.

The live broker keeps a week of what it saw of each zone; the simulator gives each job the
``HISTORY_HOURS`` of the trace before its start (wrapping), never what comes after. The
``broker`` policy's spot model is refitted once a simulated day, from the week before that
day, and every job starting that day plans on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from broker.spot_mdp import SpotPlan, plan_step_hours, solve_hours
from broker.spot_model import SpotChain, fit_chain, run_lengths

if TYPE_CHECKING:
    from broker.simulate import JobSpec, Ticks

HISTORY_HOURS = 7 * 24.0  # what the broker has seen of each zone before the job starts
REFIT_HOURS = 24.0  # how often the spot model is refitted


def _history_index(length: int, ends: np.ndarray, tick_hours: float) -> np.ndarray:
    n = min(int(HISTORY_HOURS / tick_hours), length - 1)
    return (ends[:, None] - n + np.arange(n)[None, :]) % length


def prime_history(
    available: np.ndarray, offsets: np.ndarray, tick_hours: float
) -> tuple[np.ndarray, ...]:
    """History arrays (observed, available hours, windows, last, age hours) of the week before."""
    seen = available[:, _history_index(available.shape[1], offsets, tick_hours)]  # (Z, B, n)
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
    runs: Sequence[tuple[Ticks, JobSpec]],
) -> tuple[tuple[SpotPlan, ...], np.ndarray]:
    """One plan per run, with one chain per simulated day; and each start's day (its row).

    The chain is fitted to spot in any of the zones (a job may use whichever has it).
    """
    length = available.shape[1]
    day = max(1, round(REFIT_HOURS / tick_hours))
    days, rows = np.unique(offsets // day, return_inverse=True)
    union = available.any(axis=0)
    history = union[_history_index(length, days * day, tick_hours)]
    runs_seen = [run_lengths(h, tick_hours) for h in history]
    chains: dict[float, list[SpotChain]] = {}
    plans = []
    for ticks, job in runs:
        step = plan_step_hours(tick_hours, ticks.deadline * tick_hours)
        if step not in chains:
            chains[step] = [fit_chain(up, down, step) for up, down in runs_seen]
        plans.append(
            solve_hours(
                chains[step],
                ticks.work * tick_hours,
                ticks.deadline * tick_hours,
                ticks.restart * tick_hours,
                job.spot_price,
                job.on_demand_price,
            )
        )
    return tuple(plans), rows
