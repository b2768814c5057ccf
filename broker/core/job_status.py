"""The job status machine of DESIGN.md: one table of allowed transitions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from broker.core.errors import IllegalTransition


class JobStatus(StrEnum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_MISSED = "deadline_missed"


TERMINAL: frozenset[JobStatus] = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.BUDGET_EXHAUSTED,
        JobStatus.DEADLINE_MISSED,
    }
)

_STOPS = TERMINAL - {JobStatus.SUCCEEDED}

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.PROVISIONING, *_STOPS}),
    JobStatus.PROVISIONING: frozenset(
        {JobStatus.RUNNING, JobStatus.PREEMPTED, JobStatus.SUCCEEDED, *_STOPS}
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.PREEMPTED, JobStatus.PROVISIONING, JobStatus.SUCCEEDED, *_STOPS}
    ),
    JobStatus.PREEMPTED: frozenset({JobStatus.PROVISIONING, JobStatus.SUCCEEDED, *_STOPS}),
    **{status: frozenset() for status in TERMINAL},
}
"""From each status, the statuses a job may move to (running -> provisioning: a migration;
provisioning or preempted -> succeeded: the latest checkpoint already holds all the work)."""


def is_terminal(status: str) -> bool:
    """Whether a job in ``status`` is finished for good."""
    return JobStatus(status) in TERMINAL


def check_transition(current: str, target: str) -> JobStatus:
    """The target status if ``current -> target`` is allowed, else IllegalTransition (409)."""
    source, goal = JobStatus(current), JobStatus(target)
    if goal not in ALLOWED[source]:
        raise IllegalTransition(f"a job cannot go from {source.value} to {goal.value}")
    return goal


def deadline_met(status: str, completed_at: datetime | None, deadline: datetime) -> bool | None:
    """Whether a finished job's work was complete at or before its deadline, judged on when
    the completion was observed (``Job.completed_at``); None while the job is unfinished.

    The status says how the work ended (``succeeded``: complete, perhaps late;
    ``deadline_missed``: the broker gave up with work left), this says whether it was on time.
    """
    if not is_terminal(status):
        return None
    return completed_at is not None and completed_at <= deadline
