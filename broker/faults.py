"""Test-only fault points: ``BROKER_FAULT_POINT=<step>`` makes the process die at that step.

The reliability tests use it to kill a worker with ``os._exit`` at each risky step in turn
(after a launch and before its commit, after a commit and before the ack, mid-settlement)
and check what a restart recovers. In a prefork worker the pool process dies; Celery sees a
lost worker and, with late acks, delivers the task again.
"""

from __future__ import annotations

import logging
import os

from broker.settings import get_settings

log = logging.getLogger(__name__)

# after_launch: the cloud made the instance, the attempt is not yet marked running.
# before_ack: a task's work is committed, Celery has not acknowledged the message.
# mid_settle: a job's final settlement is written but not committed.
# before_settle: a finished job is about to be settled.
# between_nodes: a gang's node is launched and recorded, the next node is not launched yet.
STEPS = ("after_launch", "before_ack", "mid_settle", "before_settle", "between_nodes")


def fault_point(step: str) -> None:
    """Exit the process at once if the configured fault point is ``step``."""
    if step not in STEPS:
        raise ValueError(f"unknown fault point {step!r}")
    if get_settings().fault_point == step:
        log.error("fault point %s reached: exiting", step)
        os._exit(70)
