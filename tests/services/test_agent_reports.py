"""The agent cannot lie: implausible work, foreign checkpoint keys and bad tokens are refused
and change nothing (issue 21)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sqlmodel import select

from broker.core.agent_tokens import token_expiry
from broker.core.errors import Conflict, InvalidInput, NotFound, Unauthorized
from broker.core.throughput import Workload
from broker.db.models import Attempt, Job
from broker.services import agent_reports, lifecycle
from broker.services.agent_reports import report_progress
from broker.services.launch_request import agent_token
from broker.services.ledger import job_reserved
from broker.services.quoting import get_planning
from broker.settings import get_settings
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen

SECRET = "agent-secret-for-tests"


def launch(session, job, clock, zone="use1-az1"):  # type: ignore[no-untyped-def]
    """Begin and launch an attempt of ``job`` with the token the runner would mint for it."""
    attempt, token = lifecycle.begin_attempt(
        session,
        job.id,
        chosen({**SPOT_PLAN, "zone": zone}, SPOT_PRICE),
        clock.now(),
        token_for=lambda attempt_id: agent_token(SECRET, attempt_id, job.deadline),
    )
    lifecycle.launch_succeeded(session, attempt.id, f"i-{zone}", clock.now(), lease_seconds=LEASE)
    return attempt, token


def most_credible(session, job, attempt, clock) -> float:  # type: ignore[no-untyped-def]
    """The bound, worked out here from the throughput model: its V100 speed for the job's
    workload times the margin, over the running time and the skew allowance."""
    settings = get_settings()
    workload = Workload.from_mapping(job.spec["workload"])
    speed = float(get_planning().model.work_per_hour(workload, np.array(["V100"]), [1])[0])
    seconds = (clock.now() - attempt.started_at).total_seconds() + settings.progress_skew_seconds
    return attempt.work_at_start + speed * settings.progress_speed_margin * seconds / 3600


def unchanged(session, job_id: str) -> tuple:  # type: ignore[type-arg]
    session.expire_all()
    job = session.get(Job, job_id)
    attempts = session.exec(select(Attempt).where(Attempt.job_id == job_id)).all()
    latest = agent_reports.latest_checkpoint(session, job_id)
    return (
        job.status,
        job.work_done,
        job.checkpointed_work,
        job_reserved(session, job_id),
        (latest.object_key, latest.work_done) if latest else None,
        sorted((a.id, a.status, a.work_done) for a in attempts),
    )


def test_a_report_of_1e12_work_is_refused_and_the_job_runs_on_with_its_reservation(
    session, clock, submit
):
    job = submit()
    attempt, token = launch(session, job, clock)
    clock.advance(1800)
    report_progress(session, attempt.id, token, 1000, None, clock.now())
    before = unchanged(session, job.id)
    assert before[0] == "running" and before[3] > 0

    for key in (None, f"jobs/{job.id}/final"):
        with pytest.raises(InvalidInput) as refused:
            report_progress(session, attempt.id, token, 1e12, key, clock.now())
        assert refused.value.field == "work_done"
        assert "at most" in refused.value.message
        assert unchanged(session, job.id) == before


def test_a_report_just_under_the_credible_bound_is_accepted_and_just_over_refused(
    session, clock, submit
):
    job = submit(market="spot")
    attempt, token = launch(session, job, clock)
    clock.advance(3600)
    bound = most_credible(session, job, attempt, clock)
    assert bound < job.total_work  # the job is big enough to cap nothing here
    with pytest.raises(InvalidInput):
        report_progress(session, attempt.id, token, bound * 1.001, None, clock.now())
    done = report_progress(session, attempt.id, token, bound * 0.999, None, clock.now())
    assert done.work_done == pytest.approx(bound * 0.999)


def test_a_lower_report_than_before_is_no_error_and_keeps_the_work(session, clock, submit):
    job = submit()
    attempt, token = launch(session, job, clock)
    clock.advance(3600)
    report_progress(session, attempt.id, token, 5000, None, clock.now())
    assert report_progress(session, attempt.id, token, 4000, None, clock.now()).work_done == 5000


@pytest.mark.parametrize(
    "key",
    [
        "jobs/{other}/ckpt-1",  # another team's job
        "jobs/{job}/../{other}/ckpt-1",
        "s3://other-bucket/jobs/{job}/ckpt-1",
        "gs://broker-checkpoints/jobs/{job}/ckpt-1",
        "/jobs/{job}/ckpt-1",
        "jobs\\{job}\\ckpt-1",
    ],
)
def test_a_checkpoint_key_outside_the_jobs_prefix_is_refused_and_never_handed_on(
    session, clock, submit, key
):
    job = submit()
    other = submit(budget=2_000_000_000)
    attempt, token = launch(session, job, clock)
    clock.advance(3600)
    before = unchanged(session, job.id)
    with pytest.raises(InvalidInput) as refused:
        report_progress(
            session, attempt.id, token, 100, key.format(job=job.id, other=other.id), clock.now()
        )
    assert refused.value.field == "checkpoint_key"
    assert f"jobs/{job.id}/" in refused.value.message
    assert unchanged(session, job.id) == before
    assert agent_reports.latest_checkpoint(session, job.id) is None  # no next attempt gets it


def test_a_checkpoint_under_the_prefix_becomes_the_latest(session, clock, submit):
    job = submit()
    attempt, token = launch(session, job, clock)
    clock.advance(3600)
    report_progress(session, attempt.id, token, 5000, f"jobs/{job.id}/a/ckpt-5000", clock.now())
    latest = agent_reports.latest_checkpoint(session, job.id)
    assert latest is not None and latest.object_key == f"jobs/{job.id}/a/ckpt-5000"


def test_a_checkpoint_holds_the_work_it_reports_not_more_reported_before(session, clock, submit):
    job = submit()
    attempt, token = launch(session, job, clock)
    clock.advance(3600)
    report_progress(session, attempt.id, token, 6000, None, clock.now())
    report_progress(session, attempt.id, token, 5000, f"jobs/{job.id}/ckpt-5000", clock.now())
    session.expire_all()
    assert session.get(Job, job.id).checkpointed_work == 5000
    assert agent_reports.latest_checkpoint(session, job.id).work_done == 5000


def test_attempt_as_token_cannot_report_for_attempt_b(session, clock, submit):
    a = submit()
    b = submit(budget=2_000_000_000)
    attempt_a, token_a = launch(session, a, clock)
    attempt_b, token_b = launch(session, b, clock, zone="use1-az2")
    clock.advance(3600)
    before = unchanged(session, b.id)
    with pytest.raises(NotFound):
        report_progress(session, attempt_b.id, token_a, 100, None, clock.now())
    assert unchanged(session, b.id) == before
    report_progress(session, attempt_b.id, token_b, 100, None, clock.now())  # its own works


def test_an_ended_attempts_token_is_refused_while_its_job_runs_on(session, clock, submit):
    job = submit()
    first, first_token = launch(session, job, clock)
    clock.advance(1800)
    lifecycle.preempted(session, first.id, clock.now())
    second, second_token = launch(session, job, clock, zone="use1-az2")
    clock.advance(1800)
    before = unchanged(session, job.id)
    with pytest.raises(Conflict):
        report_progress(session, first.id, first_token, 100, f"jobs/{job.id}/c", clock.now())
    assert unchanged(session, job.id) == before
    report_progress(session, second.id, second_token, 100, None, clock.now())


def test_an_expired_token_is_refused(session, clock, submit):
    job = submit()
    attempt, token = launch(session, job, clock)
    expiry = token_expiry(job.deadline)
    clock.set(expiry - timedelta(seconds=1))
    report_progress(session, attempt.id, token, 100, None, clock.now())
    clock.set(expiry)
    before = unchanged(session, job.id)
    with pytest.raises(Unauthorized) as refused:
        report_progress(session, attempt.id, token, 200, None, clock.now())
    assert expiry.isoformat() in refused.value.message
    assert unchanged(session, job.id) == before
