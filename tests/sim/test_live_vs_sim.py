"""The pure helpers of ``bench/live_vs_sim.py``: the market's view of a chosen trace segment
and the simulator's job built from a live one."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from bench.live_vs_sim import (
    LiveStart,
    anchored,
    pick_start,
    summary,
    trace_job,
)
from broker.sim.scenario import Ticks
from pricing.traces import Trace


def _trace(pattern: list[int], gap: float = 195.0) -> Trace:
    return Trace("f/z_v100_1.json", "z", "V100", 1, gap, np.array(pattern, bool))


def test_anchored_trace_plays_its_segment_from_the_anchor_on() -> None:
    trace = _trace([1, 1, 0, 1, 0, 0, 1, 0, 1, 1])
    view = anchored(trace, start=3, anchor_seconds=1000.0)
    for k in range(12):
        inside = 1000.0 + k * 195.0
        assert view.available_at(inside) == trace.available[(3 + k) % 10]
        assert view.available_at(inside + 194.0) == trace.available[(3 + k) % 10]
    assert view.available_at(999.0) == trace.available[2]  # the tick before its start
    assert view.gap_seconds == trace.gap_seconds and view.zone == trace.zone


def test_trace_job_keeps_the_live_jobs_work_deadline_restart_prices_and_max_cost() -> None:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    live = LiveStart(
        created_at=created,
        deadline=created + timedelta(hours=4.5),
        work_hours=3.0,
        restart_hours=0.1 + 50 / 3600,
        spot_micros=519_700,
        on_demand_micros=3_060_000,
        max_cost_micros=40_000_000,
    )
    job = trace_job(live)
    assert job.work_hours == 3.0
    assert job.deadline_hours == pytest.approx(4.5)
    assert job.restart_hours == pytest.approx(0.1 + 50 / 3600)
    assert (job.spot_price, job.on_demand_price) == (pytest.approx(0.5197), pytest.approx(3.06))
    assert job.reserved is None  # the broker's own reservation rule
    assert job.max_cost == 40.0  # ... which the net's holds may raise to max_cost, as live
    ticks = Ticks.of(job, 195.0)
    assert ticks.deadline * ticks.part_hours <= 4.5 + 1e-9


def test_pick_start_leaves_room_for_the_job_and_sees_spot_change() -> None:
    pattern = [1] * 300 + [0] * 5 + [1] * 300
    trace = _trace(pattern, gap=3600.0 * 24)  # a day a tick: the history needs 30 ticks
    start = pick_start(trace, span=10, rng=random.Random(3))
    assert 30 <= start <= len(pattern) - 10
    window = trace.available[start : start + 10]
    assert window.min() != window.max()


def test_summary_holds_rows_to_the_goal() -> None:
    rows = [
        {"ratio": 1.02, "live_met": True, "sim_met": True},
        {"ratio": 0.97, "live_met": True, "sim_met": True},
        {"ratio": 1.10, "live_met": False, "sim_met": False},
    ]
    figures = summary(rows)
    assert figures["median_ratio"] == pytest.approx(1.02)
    assert figures["max_abs_ratio_minus_1"] == pytest.approx(0.10)
    assert figures["outcomes_agree"] == 3 and figures["goal_met"]
    rows.append({"ratio": 1.2, "live_met": True, "sim_met": False})
    assert not summary(rows)["goal_met"]
