"""The hindsight optimum equals the cheapest of every schedule, on tiny traces with restarts
and deadlines that fall within ticks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.sim import hindsight
from broker.sim.hindsight import optimal_costs
from broker.sim.scenario import Ticks, TraceJob

NONE, SPOT, ON_DEMAND = 0, 1, 2


def schedule_cost(
    available: np.ndarray, ticks: Ticks, job: TraceJob, plan: tuple[int, ...]
) -> float:
    """The model of ``broker.sim.simulator`` for one zone, written out plainly: what ``plan``
    (the instance to hold each tick) costs, inf if it does not finish by the deadline."""
    p, unit = ticks.parts, ticks.part_hours
    held, overhead, work_left, cost = NONE, 0, ticks.work, 0.0
    for t, want in enumerate(plan):
        left = ticks.deadline - t * p
        if left <= 0:
            break
        if held == SPOT and not available[t]:
            held, overhead = NONE, 0
        if want == SPOT and not available[t]:
            return np.inf  # no spot to start or keep: the same as idle, never cheaper
        if want != held:
            held, overhead = want, ticks.restart if want != NONE else 0
        if held == NONE:
            continue
        usable = min(p, left)
        paid = min(overhead, usable)
        progress = min(usable - paid, work_left)
        overhead -= paid
        work_left -= progress
        cost += (paid + progress) * unit * (job.spot_price if held == SPOT else job.on_demand_price)
        if work_left == 0:
            return cost
    return np.inf


@settings(max_examples=25, deadline=None)
@given(
    pattern=st.lists(st.booleans(), min_size=8, max_size=8),
    work=st.sampled_from([0.3, 0.5, 0.6]),
    extra=st.sampled_from([0.0, 0.1, 0.2, 0.4]),
    restart=st.sampled_from([0.0, 0.1, 0.2, 0.3]),
)
def test_optimal_is_the_cheapest_schedule_on_600_second_ticks(
    pattern: list[bool], work: float, extra: float, restart: float
) -> None:
    """600 s ticks, times in tenths of an hour: restarts of 0.6, 1.2, 1.8 ticks, deadlines
    within ticks. Every schedule of the (at most 8) ticks is tried."""
    available = np.array(pattern)
    job = TraceJob(work, round(work + restart + extra, 1), restart, 0.9, 3.0)
    ticks = Ticks.of(job, 600.0)
    assert ticks.span <= len(available)
    brute = min(
        schedule_cost(available, ticks, job, plan)
        for plan in itertools.product((NONE, SPOT, ON_DEMAND), repeat=ticks.span)
    )
    best = optimal_costs(available[None, :], np.array([0]), ticks, job)[0]
    assert best == pytest.approx(brute, abs=1e-9)


def test_offsets_in_chunks_match_each_offset_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    matrix = rng.random((2, 400)) < 0.5
    job = TraceJob(3.0, 4.0, 0.2, 1.0, 3.0)
    ticks = Ticks.of(job, 600.0)
    offsets = np.arange(0, 400, 7)
    monkeypatch.setattr(hindsight, "CHUNK_CELLS", 2 * 31 * 5)  # 5 offsets a chunk
    chunked = hindsight.optimal_costs(matrix, offsets, ticks, job)
    alone = [hindsight.optimal_costs(matrix, offsets[i : i + 1], ticks, job)[0] for i in range(58)]
    assert len(offsets) == 58
    np.testing.assert_allclose(chunked, alone)
    assert np.isfinite(chunked).all()
