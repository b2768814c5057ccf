"""What a simulated start knows: the trace before it, never its own window or later."""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.policy import AvailabilityHistory
from broker.core.policy_vectorized import broker_batch
from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import plan_step_hours, solve_hours
from broker.sim.history import HISTORY_HOURS, prime_history, start_plans
from broker.sim.scenario import Ticks, TraceJob
from broker.sim.simulator import simulate_runs

JOB = TraceJob(4.0, 6.0, 0.2, 1.0, 3.0)


def runs_of(pattern: np.ndarray, seed: int) -> np.ndarray:
    """(Z, L) availability in runs of 1 to 30 ticks."""
    rng = np.random.default_rng(seed)
    flips = rng.random(pattern.shape) < 1 / 12
    return (np.cumsum(flips, axis=1) + pattern) % 2 == 1


def trace_pair(start: int, length: int = 900, zones: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Two availability matrices that agree before ``start`` and differ from it on."""
    rng = np.random.default_rng(start)
    first = runs_of(rng.integers(0, 2, (zones, 1)) + np.zeros((zones, length), np.int64), seed=1)
    second = first.copy()
    second[:, start:] = runs_of(np.ones((zones, length - start), np.int64), seed=2)
    assert (first[:, start:] != second[:, start:]).any()
    return first, second


def observed(ticks: np.ndarray, tick_hours: float) -> tuple[float, float, int, bool, float]:
    """The live broker's history (``AvailabilityHistory.observe``) after these ticks of one zone."""
    history = AvailabilityHistory()
    for available in ticks:
        history = history.observe("z", bool(available), tick_hours)
    seen = history.zones.get("z")
    if seen is None:
        return 0.0, 0.0, 0, False, 0.0
    return (
        seen.observed_hours,
        seen.available_hours,
        seen.windows,
        seen.last_available,
        seen.age_hours,
    )


@pytest.mark.parametrize("start", [0, 1, 150, 700])
def test_a_start_sees_no_tick_from_its_own_on(start: int) -> None:
    """History and plans (the fleet's prior included) are the same for two traces, and two
    fleets, that differ only from the start on: at the trace's first tick, nothing is seen."""
    (first, second), (fleet_a, fleet_b) = trace_pair(start), trace_pair(start, zones=4)
    offsets = np.array([start])
    ticks = Ticks.of(JOB, 360.0)
    histories = (prime_history(m, offsets, 0.1, 60) for m in (first, second))
    for a, b in zip(*histories, strict=True):
        np.testing.assert_array_equal(a, b)
    plans_a, _ = start_plans(first, offsets, 0.1, [(ticks, JOB)], fleet_a)
    plans_b, _ = start_plans(second, offsets, 0.1, [(ticks, JOB)], fleet_b)
    np.testing.assert_array_equal(plans_a[0].want, plans_b[0].want)
    if start == 0:
        assert (prime_history(first, offsets, 0.1, 60)[0] == 0).all()


def test_the_broker_costs_the_same_whatever_follows_its_deadline() -> None:
    """Two traces alike up to a job's deadline, different after: the same run. (With history
    wrapping around the trace, a start near its beginning would see that later part.)"""
    first, second = trace_pair(200, length=600)
    second[:, :200] = first[:, :200]
    offsets = np.array([0, 40, 130])  # deadlines (60 ticks) before tick 200
    ticks = Ticks.of(JOB, 360.0)
    got = [
        simulate_runs(broker_batch, m, offsets, [(ticks, JOB)], ("a", "b"), fleet=m)[0]
        for m in (first, second)
    ]
    np.testing.assert_array_equal(got[0].cost, got[1].cost)
    np.testing.assert_array_equal(got[0].finish_hours, got[1].finish_hours)


@pytest.mark.parametrize(
    ("start", "horizon", "first_tick"),
    [
        (0, 30, 0),  # no past
        (200, 30, 0),  # less past than HISTORY_HOURS: all of it
        (900, 30, 900 - int(HISTORY_HOURS)),  # more: the newest HISTORY_HOURS
        (990, 760, 750),  # its job wraps onto ticks 0-749: they are its future
    ],
)
def test_history_is_what_the_live_broker_would_have_seen_before_the_start(
    start: int, horizon: int, first_tick: int
) -> None:
    """1 h ticks on a 1000-tick trace: each zone's history arrays are those the live broker's
    ``AvailabilityHistory`` holds after observing the ticks [first_tick, start)."""
    matrix = runs_of(np.array([[0], [1]]) + np.zeros((2, 1000), np.int64), seed=5)
    got = prime_history(matrix, np.array([start]), 1.0, horizon)
    for z in range(2):
        expected = tuple(map(float, observed(matrix[z, first_tick:start], 1.0)))
        assert tuple(float(x[z, 0]) for x in got) == pytest.approx(expected)


def test_a_start_with_no_past_plans_on_the_prior_as_the_live_broker_would() -> None:
    """At the trace's first tick the only runs are the prior's (recorded before the trace):
    the plan is the one the live broker makes of a zone whose model holds just those runs
    (``policy.plan_for``: the zone's runs, with every zone's as the fleet prior)."""
    matrix = runs_of(np.zeros((2, 400), np.int64), seed=4)
    ticks = Ticks.of(JOB, 360.0)
    windows, outages = (0.3, 0.2, 0.5, 0.4), (3.0, 5.0, 4.0)  # short windows, long outages
    plans, _ = start_plans(matrix, np.array([0]), 0.1, [(ticks, JOB)], matrix, (windows, outages))
    step = plan_step_hours(0.1, 6.0)
    chain = fit_chain(windows, outages, step, fleet=(windows, outages))
    live = solve_hours([chain], 4.0, 6.0, 0.2, JOB.spot_price, JOB.on_demand_price)
    np.testing.assert_array_equal(plans[0].want, live.want)
    bare, _ = start_plans(matrix, np.array([0]), 0.1, [(ticks, JOB)], matrix)
    assert (plans[0].want != bare[0].want).any()  # without it: the chain's defaults
