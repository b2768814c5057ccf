"""The job status machine."""

from __future__ import annotations

import pytest

from broker.core.errors import IllegalTransition
from broker.core.job_status import ALLOWED, TERMINAL, JobStatus, check_transition


def test_terminal_statuses_have_no_way_out():
    for status in TERMINAL:
        assert ALLOWED[status] == frozenset()


@pytest.mark.parametrize("source", list(JobStatus))
def test_every_move_not_in_the_table_is_illegal(source):
    for target in JobStatus:
        if target in ALLOWED[source]:
            assert check_transition(source, target) is target
        else:
            with pytest.raises(IllegalTransition, match=f"from {source.value} to {target.value}"):
                check_transition(source, target)


def test_the_design_path_is_allowed():
    path = [
        "queued",
        "provisioning",
        "running",
        "preempted",
        "provisioning",
        "running",
        "succeeded",
    ]
    for source, target in zip(path, path[1:], strict=False):
        check_transition(source, target)


def test_deadline_met_is_completion_at_or_before_the_deadline_once_finished():
    from datetime import UTC, datetime, timedelta

    from broker.core.job_status import deadline_met

    deadline = datetime(2026, 12, 5, 12, tzinfo=UTC)
    assert deadline_met("running", deadline, deadline) is None
    assert deadline_met("succeeded", deadline, deadline) is True
    assert deadline_met("succeeded", deadline + timedelta(seconds=1), deadline) is False
    assert deadline_met("deadline_missed", None, deadline) is False
    assert deadline_met("cancelled", None, deadline) is False
