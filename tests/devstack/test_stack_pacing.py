"""The embedded stack lowers its clock's scale when its control loop lags, and every process
(this one, the API, the workers) goes on agreeing on broker time."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from broker import clock
from broker.clock import read_schedule
from broker.devstack.stack import EmbeddedStack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

if os.environ.get("BROKER_TEST_DATABASE_URL"):
    pytest.skip("the stack's clock does not depend on the database", allow_module_level=True)


def api_time(stack: EmbeddedStack) -> datetime:
    body = httpx.get(f"{stack.api_url}/healthz", timeout=10).json()
    return datetime.fromisoformat(body["time"])


def test_a_lagging_loop_slows_the_clock_and_every_process_follows(tmp_path: Path) -> None:
    # A limit of 2 broker seconds: any real delay of a tick (a few ms at x600) is "late",
    # so the workers' own lag log drives the supervisor without loading the machine.
    stack = EmbeddedStack(tmp_path, scale=600.0, min_scale=150.0, lag_limit_seconds=2.0)
    with stack:
        deadline = time.monotonic() + 60
        while stack.effective_scale > 150.0 and time.monotonic() < deadline:
            time.sleep(0.5)
        lines = stack.lag_log_path.read_text().splitlines() if stack.lag_log_path.exists() else []
        assert stack.effective_scale == 150.0, f"still x{stack.effective_scale}; log: {lines[-5:]}"
        assert [s[2] for s in read_schedule(stack.schedule_path)] == [600.0, 300.0, 150.0]
        assert [scale for _, scale in stack.scale_changes] == [300.0, 150.0]
        time.sleep(1.0)  # every process has re-read the schedule
        for _ in range(3):  # the API's process reads the same schedule
            before = clock.now()
            seen = api_time(stack)
            after = clock.now()
            assert before <= seen <= after
        started = clock.now()
        time.sleep(2.0)
        assert (clock.now() - started).total_seconds() == pytest.approx(300.0, rel=0.2)
