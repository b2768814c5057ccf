"""Spot availability as a semi-Markov chain: how long windows and outages last, by their age.

Measured spot traces are heavy-tailed: half the windows end within half an hour, yet most
spot time lies in windows of many hours, so a window that has lasted an hour is far likelier
to last another than one just begun (and likewise for outages). A memoryless chain misses
that. Here the state is (spot obtainable or not, age bucket), with buckets growing ~1.5x in
length; each bucket has its own chance per step of the window (or outage) ending, fitted
from the lengths seen, shrunk towards a prior where few were seen: the same bucket's chance
in the fleet (every zone and instance type the broker watched over the same days) when that
is given, else the overall rate. A zone seen for a few days borrows the shape of the fleet's
hazards; a zone seen for weeks keeps its own.

Pure: run lengths in, a transition matrix out. ``broker.core.spot_mdp`` plans on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

AGE_CAP_HOURS = 6.0  # ages beyond share one bucket (one hazard)
PRIOR_STEPS = 5.0  # pseudo-exposure, in steps, of the overall rate in each bucket's hazard
FLEET_PRIOR_STEPS = 300.0  # pseudo-exposure of the fleet's hazard (30 h at 0.1 h steps)
PRIOR_UP_HOURS = 2.0  # mean window and outage assumed when nothing has been seen
PRIOR_DOWN_HOURS = 1.0


def age_buckets(step_hours: float) -> np.ndarray:
    """First age (in steps, ages count from 1) of each bucket, up to ``AGE_CAP_HOURS``."""
    cap = max(1, math.ceil(AGE_CAP_HOURS / step_hours))
    edges = [1]
    while edges[-1] < cap:
        edges.append(max(edges[-1] + 1, math.ceil(edges[-1] * 1.5)))
    return np.array(edges)


def bucket_of(age_steps: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket index of ages in steps (>= 1)."""
    return np.searchsorted(edges, np.maximum(age_steps, 1), side="right") - 1


def _hazards(
    lengths: np.ndarray,
    edges: np.ndarray,
    prior_mean_steps: float,
    prior: np.ndarray | None = None,
) -> np.ndarray:
    """Chance per step that a run of age in each bucket ends, from run lengths in steps,
    shrunk towards ``prior`` (per bucket), else towards the overall rate."""
    if prior is None:
        rate = (len(lengths) + 1.0) / (lengths.sum() + prior_mean_steps)
        prior, weight = np.full(len(edges), rate), PRIOR_STEPS
    else:
        weight = FLEET_PRIOR_STEPS
    upper = np.append(edges[1:], np.iinfo(np.int64).max)  # first age past each bucket
    lengths = lengths[:, None]
    # ages at which a run could have ended inside each bucket
    exposure = np.clip(np.minimum(lengths, upper - 1) - edges + 1, 0, None).sum(axis=0)
    ends = ((lengths >= edges) & (lengths < upper)).sum(axis=0)
    hazard = (ends + weight * prior) / (exposure + weight)
    return np.clip(hazard, 1e-6, 1 - 1e-6)


def _steps(hours: Sequence[float] | np.ndarray, step_hours: float) -> np.ndarray:
    """Run lengths in whole steps (at least one)."""
    steps = np.ceil(np.asarray(hours, dtype=float) / step_hours - 1e-9)
    return np.maximum(steps, 1).astype(np.int64)


@dataclass(frozen=True)
class SpotChain:
    """Transition matrix over states x = available * A + age bucket, one step of ``step_hours``."""

    step_hours: float
    edges: np.ndarray  # (A,) first age of each bucket, in steps
    matrix: np.ndarray  # (2A, 2A), rows sum to 1


def chain_state(
    available: np.ndarray, age_hours: np.ndarray, step_hours: float, edges: np.ndarray
) -> np.ndarray:
    """State index (available * A + age bucket) on a chain of ``step_hours`` and ``edges``."""
    steps = np.maximum(np.ceil(np.asarray(age_hours) / step_hours - 1e-9), 1)
    return np.asarray(available, dtype=np.int64) * len(edges) + bucket_of(steps, edges)


def fit_chain(
    up_hours: Sequence[float] | np.ndarray,
    down_hours: Sequence[float] | np.ndarray,
    step_hours: float,
    fleet: tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray] | None = None,
) -> SpotChain:
    """The chain whose windows and outages last as the given lengths (hours) did.

    ``fleet``: the (window, outage) lengths seen across the fleet over the same time, the
    prior each bucket's hazard shrinks towards.
    """
    edges = age_buckets(step_hours)
    a = len(edges)
    # widths of the buckets in steps; the last bucket keeps its runs until they end
    advance = np.append(1.0 / np.diff(edges), 0.0)
    matrix = np.zeros((2 * a, 2 * a))
    kinds = (
        (0, down_hours, None if fleet is None else fleet[1], PRIOR_DOWN_HOURS),
        (1, up_hours, None if fleet is None else fleet[0], PRIOR_UP_HOURS),
    )
    for available, runs, fleet_runs, prior_hours in kinds:
        mean_steps = prior_hours / step_hours
        prior = None
        if fleet_runs is not None:
            prior = _hazards(_steps(fleet_runs, step_hours), edges, mean_steps)
        hazard = _hazards(_steps(runs, step_hours), edges, mean_steps, prior)
        rows = available * a + np.arange(a)
        matrix[rows, (1 - available) * a] = hazard
        stay = 1.0 - hazard
        matrix[rows, rows] += stay * (1.0 - advance)
        matrix[rows[:-1], rows[:-1] + 1] += stay[:-1] * advance[:-1]
    return SpotChain(step_hours=step_hours, edges=edges, matrix=matrix)


def run_lengths(available: np.ndarray, tick_hours: float) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (hours) of the finished windows and outages in a sample series.

    The first and the last run are cut by the series' ends, so neither counts.
    """
    values = np.asarray(available, dtype=bool)
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    if len(change) < 2:
        return np.zeros(0), np.zeros(0)
    lengths = np.diff(change) * tick_hours
    states = values[change[:-1]]
    return lengths[states], lengths[~states]
