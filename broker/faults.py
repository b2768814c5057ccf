"""Test-only fault points: ``BROKER_FAULT_POINT=<step>`` makes the process die at that step.

The reliability tests use it to kill a worker with ``os._exit`` at each risky step in turn
(after a launch and before its commit, mid-settlement) and check what a restart recovers.
"""

from __future__ import annotations

import logging
import os

from broker.settings import get_settings

log = logging.getLogger(__name__)

STEPS = ("after_launch", "before_settle", "before_ack")


def fault_point(step: str) -> None:
    """Exit the process at once if the configured fault point is ``step``."""
    if step not in STEPS:
        raise ValueError(f"unknown fault point {step!r}")
    if get_settings().fault_point == step:
        log.error("fault point %s reached: exiting", step)
        os._exit(70)
