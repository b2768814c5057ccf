"""Preemption rates and availability from traces."""

from __future__ import annotations

import numpy as np
import pytest

from pricing.spot_risk import (
    availability,
    availability_by_trace,
    bundled_risk_model,
    estimate,
    preemption_rate,
    preemptions,
    trace_region,
)
from pricing.traces import Trace, bundled_traces


def trace(zone: str, samples: str, gpu: str = "V100", gap: float = 3600.0) -> Trace:
    """A trace from a string of A (available) and x (not)."""
    available = np.array([c == "A" for c in samples])
    return Trace(f"t/{zone}", zone, gpu, 1, gap, available)


def test_preemptions_count_available_to_unavailable_transitions() -> None:
    t = trace("us-east-1a", "AAxAAxxA")
    assert preemptions(t) == 2
    assert preemption_rate(t) == pytest.approx(2 / 5)  # 5 available hours
    assert availability(t) == pytest.approx(5 / 8)


def test_a_trace_never_available_has_rate_zero() -> None:
    assert preemption_rate(trace("us-east-1a", "xxxx")) == 0.0


def test_trace_zone_names_map_to_regions() -> None:
    assert trace_region("us-east-1a") == "us-east-1"
    assert trace_region("us-west-2c") == "us-west-2"
    assert trace_region("use1-az2") == "use1-az2"


def test_rates_pool_per_region_and_gpu_and_default_to_the_median() -> None:
    traces = [
        trace("us-east-1a", "AAxAAxxA"),  # 2 preemptions, 5 h
        trace("us-east-1b", "AAAAAxAA", gap=1800.0),  # 1 preemption, 3.5 h
        trace("us-west-2a", "AxAxAxAx"),  # 4 preemptions, 4 h
    ]
    model = estimate(traces)
    assert model.rates["us-east-1", "V100"] == pytest.approx(3 / 8.5)
    assert model.rates["us-west-2", "V100"] == pytest.approx(1.0)
    assert model.default_rate == pytest.approx(np.median([0.4, 1 / 3.5, 1.0]))
    assert model.rate("eu-west-1", "V100") == model.default_rate
    rates = model.rates_for(
        np.array(["us-east-1", "eu-west-1", "us-west-2"]), np.array(["V100", "V100", "V100"])
    )
    assert rates.tolist() == pytest.approx([3 / 8.5, model.default_rate, 1.0])


def test_bundled_traces_give_positive_rates_for_their_regions() -> None:
    model = bundled_risk_model()
    assert {("us-east-1", "V100"), ("us-west-2", "V100"), ("us-west-2", "K80")} <= set(model.rates)
    assert all(rate > 0 for rate in model.rates.values())
    assert model.default_rate > 0
    fractions = availability_by_trace(bundled_traces())
    assert len(fractions) == len(bundled_traces())
    assert all(0.0 <= f <= 1.0 for f in fractions.values())
