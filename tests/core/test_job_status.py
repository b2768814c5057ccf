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
