"""How much work an agent may claim: the attempt's start plus its running time at top speed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.core.errors import InvalidInput
from broker.core.progress import check_credible, credible_work

STARTED = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_before_the_instance_runs_only_the_start_and_the_skew_allowance_are_credible() -> None:
    assert credible_work(500.0, None, STARTED, 1000.0, 0.0) == 500.0
    assert credible_work(500.0, None, STARTED, 1000.0, 36.0) == pytest.approx(510.0)


def test_credible_work_grows_with_running_time_at_top_speed() -> None:
    later = STARTED + timedelta(hours=2)
    assert credible_work(500.0, STARTED, later, 1000.0, 0.0) == pytest.approx(2500.0)
    assert credible_work(500.0, STARTED, later, 1000.0, 360.0) == pytest.approx(2600.0)


def test_a_clock_behind_the_start_counts_no_running_time() -> None:
    earlier = STARTED - timedelta(hours=1)
    assert credible_work(500.0, STARTED, earlier, 1000.0, 0.0) == 500.0


def test_more_than_credible_is_refused_naming_work_done_and_the_most_credible() -> None:
    check_credible(2500.0, 2500.0, STARTED)  # at the bound: fine
    with pytest.raises(InvalidInput) as refused:
        check_credible(1e12, 2500.0, STARTED)
    assert refused.value.field == "work_done"
    assert "at most 2500" in refused.value.message
    assert STARTED.isoformat() in refused.value.message
