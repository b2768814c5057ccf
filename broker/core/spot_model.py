"""One spot model per (provider, zone, instance family): the runs it is fitted on, and the
preemption rate the planner ranks with, read off the chain the policy plans on.

A model is a ``ZoneHistory`` (``broker.core.policy``): the lengths of the spot windows and
outages that ended, and the current one's state and age. Its runs are a prior (a sample of
the bundled traces' runs) followed by what the broker's own attempts saw, newest last, at
most ``MAX_RUNS`` of each kind: observations push the prior out as they accumulate.

The policy fits a job's chain with ``fit_chain(up, down, step, fleet=...)`` on the runs of its
zones, with the runs of every zone in its history as the prior (``policy.plan_for``). For a
job confined to one zone both are that zone's runs: ``zone_chain``. The planner's rate for an
offer is the long-run preemptions per available hour of that same chain (one over its mean
window: renewal), at the step most plans use (``RISK_STEP_HOURS``).

Instance family (``family``): AWS, the instance type's prefix before the dot (``p3`` for
p3.2xlarge, ``p3dn`` for p3dn.24xlarge); GCP, the machine family before the first dash
(``a2``, ``a3``, ``g2``), except N1, whose GPUs are attached, so its family names the GPU
(``n1-T4``, ``n1-V100``). Spot capacity is pooled per family within a zone.

Pure: runs in, rates out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from broker.core.offers import OfferTable
from broker.core.policy import ZoneHistory
from broker.core.spot_chain import SpotChain, fit_chain
from broker.core.spot_mdp import MIN_STEP_HOURS

RISK_STEP_HOURS = MIN_STEP_HOURS  # plans step at 0.1 h unless the deadline is far off
MAX_RUNS = 500  # newest windows (and outages) a model keeps: ~4 KB of JSON per kind
PRIOR_RUNS = 100  # runs of the zone's own traces in its prior (a few weeks of a zone)
FLEET_PRIOR_RUNS = 25  # runs of the pooled traces for a zone without one: a weaker prior


def family(provider: str, instance_type: str, gpu: str) -> str:
    """The instance family spot capacity is pooled by (see the module docstring)."""
    if provider == "aws":
        return instance_type.split(".", 1)[0]
    machine = instance_type.split("-", 1)[0]
    return f"{machine}-{gpu}" if machine == "n1" else machine


def families(offers: OfferTable) -> np.ndarray:
    """``family`` of every offer row (one call per distinct shape)."""
    if len(offers) == 0:
        return np.zeros(0, dtype="<U1")
    keys = np.char.add(
        np.char.add(np.char.add(offers.provider, "\x1f"), offers.instance_type),
        np.char.add("\x1f", offers.gpu),
    )
    unique, inverse = np.unique(keys, return_inverse=True)
    names = np.array([family(*str(k).split("\x1f")) for k in unique])
    return names[inverse.reshape(-1)]


def prior_sample(runs: Sequence[float] | np.ndarray, n: int) -> tuple[float, ...]:
    """``n`` runs at evenly spaced quantiles of ``runs`` (all of them when fewer): a smaller
    prior with the same shape of lengths, so observations weigh sooner."""
    ordered = np.sort(np.asarray(runs, dtype=float))
    if len(ordered) > n:
        ordered = ordered[((np.arange(n) + 0.5) * len(ordered) / n).astype(np.int64)]
    return tuple(float(r) for r in ordered)


def zone_history(
    up_runs: Sequence[float] | np.ndarray,
    down_runs: Sequence[float] | np.ndarray,
    last_available: bool = False,
    age_hours: float = 0.0,
) -> ZoneHistory:
    """The ``ZoneHistory`` of these runs and current state, its totals filled in as
    ``AvailabilityHistory.observe`` would (so its window and availability estimates agree)."""
    up, down = tuple(map(float, up_runs)), tuple(map(float, down_runs))
    available = sum(up) + (age_hours if last_available else 0.0)
    return ZoneHistory(
        observed_hours=sum(up) + sum(down) + age_hours,
        available_hours=available,
        windows=len(up) + int(last_available and age_hours > 0),
        last_available=last_available,
        up_runs=up,
        down_runs=down,
        age_hours=age_hours,
    )


def combine(
    prior_up: Sequence[float],
    prior_down: Sequence[float],
    observed: ZoneHistory,
    cap: int = MAX_RUNS,
) -> ZoneHistory:
    """The prior's runs, then the observed ones, newest ``cap`` of each kind kept; the current
    state is the observed one."""
    up = (*prior_up, *observed.up_runs)[-cap:] if cap else ()
    down = (*prior_down, *observed.down_runs)[-cap:] if cap else ()
    return zone_history(up, down, observed.last_available, observed.age_hours)


def zone_chain(seen: ZoneHistory, step_hours: float = RISK_STEP_HOURS) -> SpotChain:
    """The chain ``policy.plan_for`` fits for a job whose only zone is this one."""
    runs = (seen.up_runs, seen.down_runs)
    return fit_chain(*runs, step_hours, fleet=runs)


def mean_run_hours(chain: SpotChain, available: bool) -> float:
    """Expected length of a window (``available``) or an outage on ``chain``, from its start."""
    a = len(chain.edges)
    rows = np.arange(a) + (a if available else 0)
    stay = chain.matrix[np.ix_(rows, rows)]
    steps = np.linalg.solve(np.eye(a) - stay, np.ones(a))
    return float(steps[0]) * chain.step_hours


@dataclass(frozen=True)
class SpotStats:
    """What the planner and the API read of one model."""

    preemptions_per_hour: float  # per hour on spot, long run: 1 / mean_window_hours
    mean_window_hours: float
    mean_outage_hours: float


def chain_stats(chain: SpotChain) -> SpotStats:
    """Rates of one chain."""
    window = mean_run_hours(chain, True)
    return SpotStats(1.0 / window, window, mean_run_hours(chain, False))


def spot_stats(seen: ZoneHistory, step_hours: float = RISK_STEP_HOURS) -> SpotStats:
    """Rates of the chain the policy fits on ``seen`` (``zone_chain``)."""
    return chain_stats(zone_chain(seen, step_hours))


REFUSED_OUTAGE_HOURS = 0.1  # a capacity refusal, read as a short outage


def attempt_sightings(
    zone: str,
    end_reason: str | None,
    started_at: datetime | None,
    ended_at: datetime | None,
    now: datetime,
    nodes: int = 1,
) -> tuple[tuple[str, bool, float], ...]:
    """What one spot attempt saw of its zone, as ``(zone, available, hours)`` observations:
    a capacity refusal is a short outage; a running time (to ``now`` while it runs) an
    available window of ``nodes`` x its hours, which a preemption ends; an attempt that never
    started, nothing. ``nodes``: a gang's N nodes each ran that long and any one's preemption
    ended it, N node-windows of exposure, as the planner's N x rate assumes (1 for the age of
    a zone's current window)."""
    if end_reason == "capacity":
        return ((zone, False, REFUSED_OUTAGE_HOURS),)
    if started_at is None:
        return ()
    hours = max(((ended_at or now) - started_at).total_seconds() / 3600 * max(nodes, 1), 0.0)
    if end_reason == "preempted":
        return ((zone, True, hours), (zone, False, 0.0))
    return ((zone, True, hours),)
