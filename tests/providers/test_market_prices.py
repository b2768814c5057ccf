"""Market replay prices: set now, staged for later, cleared with the overrides."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.clock import ManualClock
from providers.local.market import MarketReplay

START = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_staged_prices_take_effect_when_the_clock_passes_them_in_time_order() -> None:
    clock = ManualClock(START)
    market = MarketReplay({}, clock=clock)
    market.stage_price(START + timedelta(hours=2), "aws", "use1-az2", "p3.2xlarge", "spot", 3)
    market.stage_price(START + timedelta(hours=1), "aws", "use1-az2", "p3.2xlarge", "spot", 2)
    market.set_price("AWS", "use1-az2", "p3.2xlarge", "spot", 1)
    market.set_price("gcp", "us-central1-a", "n1-standard-8", "on_demand", 9, gpu="t4")
    assert [c.micros_per_hour for c in market.price_changes("aws")] == [1]
    clock.advance(3600)
    assert [c.micros_per_hour for c in market.price_changes("aws")] == [1, 2]
    clock.advance(3600)
    changes = market.price_changes()
    assert [c.micros_per_hour for c in changes] == [1, 9, 2, 3]
    assert changes[1].gpu == "T4" and changes[0].provider == "aws"
    market.clear_overrides()
    assert market.price_changes() == []


def test_a_price_names_its_market() -> None:
    market = MarketReplay({}, clock=ManualClock(START))
    with pytest.raises(ValueError, match="market must be one of"):
        market.set_price("aws", "use1-az2", "p3.2xlarge", "reserved", 1)
