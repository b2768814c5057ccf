"""One deadline-outcome rule (docs/architecture.md, "Job status"): the status says how the
work ended, ``deadline_met`` whether it was complete by the deadline, judged on when the
completion was observed, not on when a task got round to finishing the job."""

from __future__ import annotations

from datetime import timedelta

from broker.core.job_status import JobStatus, deadline_met
from broker.db.models import Job
from broker.services import agent_reports, lifecycle
from broker.services.ledger import job_reserved


def _outcome(session, job_id):
    job = session.get(Job, job_id)
    session.refresh(job)
    return job.status, job.completed_at, deadline_met(job.status, job.completed_at, job.deadline)


def _final_checkpoint(session, job, attempt, token, now):
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work, f"jobs/{job.id}/final", now
    )


def test_work_checkpointed_before_the_deadline_meets_it_even_if_finished_after(
    session, clock, submit, run_spot
):
    job = submit()
    attempt, token = run_spot(job)
    clock.set(job.deadline - timedelta(minutes=5))
    observed = clock.now()
    _final_checkpoint(session, job, attempt, token, observed)
    assert _outcome(session, job.id)[2] is None  # not finished yet: no outcome
    clock.set(job.deadline + timedelta(minutes=20))  # the control loop gets there late
    lifecycle.stop(session, job.id, JobStatus.SUCCEEDED, "work reached", clock.now())
    assert _outcome(session, job.id) == ("succeeded", observed, True)


def test_work_completed_after_the_deadline_succeeds_but_misses_it(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    clock.set(job.deadline + timedelta(minutes=1))
    _final_checkpoint(session, job, attempt, token, clock.now())
    lifecycle.preempted(session, attempt.id, clock.now())
    assert _outcome(session, job.id) == ("succeeded", job.deadline + timedelta(minutes=1), False)


def test_deadline_passing_with_work_left_is_deadline_missed(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work / 2, f"jobs/{job.id}/half", clock.now()
    )
    clock.set(job.deadline)
    lifecycle.stop(session, job.id, JobStatus.DEADLINE_MISSED, "deadline passed", clock.now())
    assert _outcome(session, job.id) == ("deadline_missed", None, False)
    assert job_reserved(session, job.id) == 0


def test_a_stop_after_the_work_completed_is_a_success(session, clock, submit, run_spot):
    """A budget or deadline stop that finds the work checkpointed whole ends succeeded."""
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(600)
    done = clock.now()
    _final_checkpoint(session, job, attempt, token, done)
    clock.set(job.deadline + timedelta(hours=1))
    lifecycle.stop(session, job.id, JobStatus.DEADLINE_MISSED, "deadline passed", clock.now())
    assert _outcome(session, job.id) == ("succeeded", done, True)
    assert session.get(Job, job.id).status_reason == "work reached (checkpointed)"


def test_exit_0_is_observed_complete_at_its_report(session, clock, submit, run_spot):
    job = submit()
    attempt, _ = run_spot(job)
    clock.set(job.deadline - timedelta(seconds=1))
    lifecycle.program_exited(session, attempt.id, 0, "", clock.now())
    assert _outcome(session, job.id) == ("succeeded", job.deadline - timedelta(seconds=1), True)


def test_cancel_and_failure_carry_deadline_not_met(session, clock, submit, run_spot):
    cancelled = submit()
    lifecycle.cancel(session, cancelled.team_id, cancelled.id, clock.now())
    assert _outcome(session, cancelled.id) == ("cancelled", None, False)
    failed = submit(budget=999_000_000, max_restarts_on_errors=0)
    attempt, _ = run_spot(failed)
    lifecycle.program_exited(session, attempt.id, 3, "boom", clock.now())
    assert _outcome(session, failed.id) == ("failed", None, False)
