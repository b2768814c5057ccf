"""Read-only views of jobs for the API: one job with its parts, pages of jobs, spend."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from broker.core.errors import InvalidInput, NotFound
from broker.core.job_status import JobStatus
from broker.db.models import Attempt, Checkpoint, Job
from broker.services.ledger import job_reserved, job_spent


@dataclass(frozen=True)
class JobView:
    """A job with its attempts, checkpoints and money, as the API shows it."""

    job: Job
    attempts: list[Attempt]
    checkpoints: list[Checkpoint]
    spent: int
    reserved: int


def get_job(session: Session, team_id: str, job_id: str) -> Job:
    """A team's job; another team's job is NotFound, never a hint that it exists."""
    job = session.get(Job, job_id)
    if job is None or job.team_id != team_id:
        raise NotFound(f"job {job_id} not found")
    return job


def job_view(session: Session, team_id: str, job_id: str) -> JobView:
    """A team's job with its attempts, checkpoints, spend and reservation."""
    job = get_job(session, team_id, job_id)
    attempts = session.exec(
        select(Attempt).where(Attempt.job_id == job.id).order_by(col(Attempt.id))
    ).all()
    checkpoints = session.exec(
        select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(col(Checkpoint.id))
    ).all()
    return JobView(
        job,
        list(attempts),
        list(checkpoints),
        job_spent(session, job.id),
        job_reserved(session, job.id),
    )


def new_job_view(job: Job, reserved: int) -> JobView:
    """The view of a job just admitted: nothing launched, spent or saved yet."""
    return JobView(job, [], [], 0, reserved)


def list_jobs(
    session: Session, team_id: str, status: str | None, limit: int, cursor: str | None
) -> tuple[list[Job], str | None]:
    """A page of a team's jobs, newest first; the cursor is the last id of the previous page."""
    query = select(Job).where(Job.team_id == team_id)
    if status is not None:
        try:
            query = query.where(Job.status == JobStatus(status).value)
        except ValueError:
            raise InvalidInput(
                f"unknown status {status!r}", field="status", location="query"
            ) from None
    if cursor:
        query = query.where(col(Job.id) < cursor)
    jobs = list(session.exec(query.order_by(col(Job.id).desc()).limit(limit + 1)).all())
    next_cursor = jobs[limit - 1].id if len(jobs) > limit else None
    return jobs[:limit], next_cursor
