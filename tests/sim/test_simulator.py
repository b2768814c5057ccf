"""The simulator and the hindsight optimum on hand-made traces with known costs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.policy_vectorized import BATCH_POLICIES
from broker.sim.hindsight import optimal_costs
from broker.sim.scenario import Ticks, TraceJob, start_offsets, zone_matrix
from broker.sim.simulator import simulate, simulate_runs, simulate_ticks
from pricing.traces import Trace

# 0.1 h ticks; 4 h of work in 6 h; 0.2 h restart; spot $1/h, on-demand $3/h
JOB = TraceJob(
    work_hours=4.0, deadline_hours=6.0, restart_hours=0.2, spot_price=1.0, on_demand_price=3.0
)


def trace(pattern: list[tuple[bool, int]], zone: str = "z") -> Trace:
    available = np.concatenate([np.full(n, value) for value, n in pattern])
    return Trace(
        name=zone, zone=zone, gpu="V100", gpu_count=1, gap_seconds=360.0, available=available
    )


ALWAYS = trace([(True, 100)])
NEVER = trace([(False, 100)])
OUTAGE = trace([(True, 20), (False, 10), (True, 70)])  # spot lost from 2 h to 3 h

EXPECTED = {
    # spot all the way: (4 + 0.2) x $1; on-demand: (4 + 0.2) x $3
    "always": (
        ALWAYS,
        {"on_demand": 12.6, "greedy": 4.2, "uniform_progress": 4.2, "broker": 4.2, "optimal": 4.2},
    ),
    "never": (
        NEVER,
        {
            "on_demand": 12.6,
            "greedy": 12.6,
            "uniform_progress": 12.6,
            "broker": 12.6,
            "optimal": 12.6,
        },
    ),
    # greedy waits out the outage and restarts on spot: 2 + 2.4. Uniform Progress falls
    # behind its line at 2.8 h, runs on-demand until 4.4 h, then spot: 2 + 4.8 + 1. The
    # broker starts at the trace's first tick, so it has no history (none wraps from the
    # trace's end): its plan rests on the chain's defaults (2 h windows, 1 h outages); it
    # expects the outage to end with slack to spare and waits as greedy does.
    "outage": (
        OUTAGE,
        {"on_demand": 12.6, "greedy": 4.4, "uniform_progress": 7.8, "broker": 4.4, "optimal": 4.4},
    ),
}


def costs(traces: list[Trace], job: TraceJob = JOB) -> dict[str, float]:
    offsets = np.array([0])
    result = {name: float(simulate(name, traces, job, offsets).cost[0]) for name in BATCH_POLICIES}
    matrix, gap = zone_matrix(traces)
    result["optimal"] = float(optimal_costs(matrix, offsets, Ticks.of(job, gap), job)[0])
    return result


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_exact_costs_on_hand_made_traces(case: str) -> None:
    single, expected = EXPECTED[case]
    assert costs([single]) == pytest.approx(expected, abs=1e-9)


def test_multi_zone_moves_to_the_other_zone_and_optimal_needs_one_start() -> None:
    zone_a = trace([(True, 20), (False, 80)], "a")
    zone_b = trace([(False, 10), (True, 90)], "b")
    got = costs([zone_a, zone_b])
    # greedy: a until 2 h (1.8 h done), restart in b: 2 + 2.4; optimal: b from 1 h, 4.2 h
    assert got["greedy"] == pytest.approx(4.4)
    assert got["optimal"] == pytest.approx(4.2)


def test_no_deadline_missed_and_finish_times_on_the_outage_trace() -> None:
    result = simulate("greedy", [OUTAGE], JOB, np.array([0]))
    assert not result.missed[0]
    assert result.finish_hours[0] == pytest.approx(5.4)


def test_hours_become_exact_parts_of_a_tick() -> None:
    # 195 s ticks: 48 h, 52.8 h and 0.1 h are whole 13ths of a tick (15 s each)
    ticks = Ticks.of(TraceJob(48.0, 52.8, 0.1, 0.92, 3.06), 195.0)
    assert (ticks.parts, ticks.work, ticks.deadline, ticks.restart) == (13, 11520, 12672, 24)
    assert ticks.span == 975  # the last tick only in part
    # 600 s ticks: a 0.2 h restart is 6 fifths of a tick, 0.2 h, not 2 ticks (0.333 h)
    ticks = Ticks.of(TraceJob(24.0, 26.4, 0.2, 0.92, 3.06), 600.0)
    assert (ticks.parts, ticks.work, ticks.deadline, ticks.restart) == (5, 720, 792, 6)
    assert ticks.restart * ticks.part_hours == pytest.approx(0.2)


def test_hours_no_split_of_the_tick_fits_are_rounded_conservatively() -> None:
    # 61 s ticks: an hour is 3600/61 ticks, whole only in 61sts; the finest split (60) rounds
    ticks = Ticks.of(TraceJob(1.0, 1.5, 0.1, 1.0, 3.0), 61.0)
    assert (ticks.parts, ticks.work, ticks.deadline, ticks.restart) == (60, 3541, 5311, 355)


@settings(max_examples=40, deadline=None)
@given(
    zones=st.integers(1, 2),
    length=st.integers(20, 60),
    seed=st.integers(0, 2**31),
    work=st.integers(5, 30),
    extra=st.integers(0, 25),
    restart=st.integers(0, 4),
    stickiness=st.floats(0.5, 0.97),
    gap=st.sampled_from([360.0, 600.0, 195.0]),  # 0.1 h steps whole, or in parts of a tick
)
def test_optimal_is_a_lower_bound_and_nobody_misses_a_feasible_deadline(
    zones: int,
    length: int,
    seed: int,
    work: int,
    extra: int,
    restart: int,
    stickiness: float,
    gap: float,
) -> None:
    rng = np.random.default_rng(seed)
    flips = rng.random((zones, length)) > stickiness  # runs of availability
    available = (np.cumsum(flips, axis=1) + rng.integers(0, 2, (zones, 1))) % 2 == 1
    traces = [Trace(f"z{z}", f"z{z}", "V100", 1, gap, available[z]) for z in range(zones)]
    job = TraceJob(work * 0.1, (work + restart + extra) * 0.1, restart * 0.1, 1.0, 3.0)
    offsets = start_offsets(length, 5)
    matrix, gap = zone_matrix(traces)
    best = optimal_costs(matrix, offsets, Ticks.of(job, gap), job)
    for name in BATCH_POLICIES:
        result = simulate(name, traces, job, offsets)
        assert not result.missed.any(), name  # on-demand alone fits: work + restart <= deadline
        assert (best <= result.cost + 1e-9).all(), name


def test_runs_simulated_together_match_each_run_alone() -> None:
    rng = np.random.default_rng(7)
    zones = [Trace(f"z{i}", f"z{i}", "V100", 1, 600.0, rng.random(300) < 0.6) for i in range(2)]
    matrix, gap = zone_matrix(zones)
    offsets = start_offsets(matrix.shape[1], 20)
    jobs = [TraceJob(4.0, 6.0, 0.2, 1.0, 3.0), TraceJob(8.0, 9.0, 0.5, 1.0, 3.0)]
    runs = [(Ticks.of(job, gap), job) for job in jobs]
    assert [ticks.parts for ticks, _ in runs] == [5, 1]  # ticks split differently, one loop
    labels = ("z0", "z1")
    for name, decide in BATCH_POLICIES.items():
        together = simulate_runs(decide, matrix, offsets, runs, labels)
        for (ticks, job), got in zip(runs, together, strict=True):
            alone = simulate_ticks(decide, matrix, offsets, ticks, job, labels)
            np.testing.assert_array_equal(got.cost, alone.cost, err_msg=name)
            np.testing.assert_array_equal(got.missed, alone.missed, err_msg=name)
            np.testing.assert_array_equal(got.finish_hours, alone.finish_hours, err_msg=name)


def ten_minute(pattern: list[tuple[bool, int]]) -> Trace:
    """A trace of 600 s ticks (1/6 h): a 0.2 h restart is 1.2 ticks."""
    available = np.concatenate([np.full(n, value) for value, n in pattern])
    return Trace("z", "z", "V100", 1, 600.0, available)


def test_a_restart_costs_its_fraction_of_a_tick_and_the_rest_of_the_tick_works() -> None:
    """Spot for 2 ticks (1/3 h), gone 10 (to 2 h), then back; 4 h of work, 0.2 h restarts.

    Greedy starts on spot at 0: 0.2 h of restart, then 0.1333 h of work, paid 1/3 h, lost at
    1/3 h. It restarts on spot at 2 h: 0.2 h, then the 3.8667 h left: done at 6.0667 h, paid
    4.0667 h, $4.40 in all. On-demand alone: 0.2 + 4 h at $3, done at 4.2 h (whole ticks of
    restart would make it 4.333 h and $13). The optimum waits for the window at 2 h: 4.2 h of
    spot, done at 6.2 h."""
    gone = ten_minute([(True, 2), (False, 10), (True, 60)])
    job = TraceJob(4.0, 8.0, 0.2, 1.0, 3.0)
    greedy = simulate("greedy", [gone], job, np.array([0]))
    assert greedy.cost[0] == pytest.approx(4.4)
    assert greedy.finish_hours[0] == pytest.approx(6 + 1 / 15)
    on_demand = simulate("on_demand", [gone], job, np.array([0]))
    assert on_demand.cost[0] == pytest.approx(12.6)
    assert on_demand.finish_hours[0] == pytest.approx(4.2)
    matrix, gap = zone_matrix([gone])
    assert optimal_costs(matrix, np.array([0]), Ticks.of(job, gap), job)[0] == pytest.approx(4.2)


def test_a_deadline_within_a_tick_counts_to_the_part() -> None:
    """4 h of work and a 0.2 h restart due in 4.3 h (25.8 ticks): on-demand from the start
    makes it at 4.2 h; in whole ticks (4 h + 2 ticks of restart, due at tick 25) it could not.
    Due in 4.15 h, nobody can: a miss, finished late on on-demand in the cost."""
    never = ten_minute([(False, 40)])
    for deadline, missed in ((4.3, False), (4.15, True)):
        job = TraceJob(4.0, deadline, 0.2, 1.0, 3.0)
        for name in BATCH_POLICIES:
            result = simulate(name, [never], job, np.array([0]))
            assert result.missed[0] == missed, name
            assert result.cost[0] == pytest.approx(12.6), name
        matrix, gap = zone_matrix([never])
        best = optimal_costs(matrix, np.array([0]), Ticks.of(job, gap), job)[0]
        assert best == (np.inf if missed else pytest.approx(12.6))
