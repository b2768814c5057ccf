"""Market replay: which trace drives which zone, availability on the clock, overrides."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from broker.clock import ManualClock
from pricing.traces import Trace, bundled_traces
from providers.local.market import ANY_GPU, MarketReplay, default_assignments

START = datetime(2024, 1, 1, tzinfo=UTC)


def _trace(pattern: list[bool], gap: float = 60.0, zone: str = "us-east-1a") -> Trace:
    return Trace("synthetic", zone, "V100", 1, gap, np.array(pattern, dtype=bool))


def test_trace_zones_follow_their_own_trace_per_gpu() -> None:
    assignments = default_assignments()
    v100 = assignments[("aws", "us-east-1a", "V100")]
    assert (v100.zone, v100.gpu, v100.gpu_count) == ("us-east-1a", "V100", 1)
    assert v100.name.startswith("aws-02-15-2023")  # the longest single-node trace wins
    k80 = assignments[("aws", "us-west-2a", "K80")]
    assert (k80.gpu, k80.gpu_count) == ("K80", 1)
    assert assignments[("aws", "us-west-2a", ANY_GPU)].gpu == "V100"


def test_other_aws_zones_and_gcp_zones_get_distinct_real_traces() -> None:
    gcp_zones = ["us-central1-a", "us-central1-b", "us-east1-b"]
    assignments = default_assignments(aws_zones=["us-east-1b"], gcp_zones=gcp_zones)
    assert ("aws", "us-east-1b", ANY_GPU) in assignments
    gcp = [assignments[("gcp", zone, ANY_GPU)] for zone in gcp_zones]
    assert len({t.name for t in gcp}) == 3
    assert all(t in bundled_traces() for t in gcp)


def test_availability_follows_the_trace_on_the_clock() -> None:
    clock = ManualClock(START)
    trace = _trace([True, False, True])
    market = MarketReplay({("aws", "us-east-1a", "V100"): trace}, clock=clock)
    assert market.is_available("aws", "us-east-1a", "V100")
    clock.advance(60)
    assert not market.is_available("aws", "us-east-1a", "V100")
    clock.advance(60)
    assert market.is_available("aws", "us-east-1a", "V100")
    clock.advance(60)  # wraps around
    assert market.is_available("aws", "us-east-1a", "V100")
    assert market.is_available("aws", "us-east-1b", "V100")  # no trace: always available


def test_offset_starts_the_replay_later_in_the_trace() -> None:
    trace = _trace([True, False])
    market = MarketReplay(
        {("gcp", "us-central1-a", ANY_GPU): trace}, offset_seconds=60, clock=ManualClock(START)
    )
    assert not market.is_available("gcp", "us-central1-a", "T4")


def test_overrides_win_over_the_trace_until_cleared() -> None:
    market = MarketReplay({("aws", "z", "V100"): _trace([True])}, clock=ManualClock(START))
    market.set_available("aws", "z", "V100", False)
    assert not market.is_available("aws", "z", "V100")
    market.set_available("aws", "z", "V100", None)
    assert market.is_available("aws", "z", "V100")
    market.set_available("aws", "z", ANY_GPU, False)
    assert not market.is_available("aws", "z", "A100")
    market.clear_overrides()
    assert market.is_available("aws", "z", "A100")


def test_step_runs_every_preemptor_even_if_one_fails() -> None:
    market = MarketReplay({}, clock=ManualClock(START))
    calls: list[str] = []

    def broken(_: MarketReplay) -> int:
        raise RuntimeError("boom")

    def working(_: MarketReplay) -> int:
        calls.append("ran")
        return 2

    market.attach(broken)
    market.attach(working)
    assert market.step() == 2
    assert calls == ["ran"]
