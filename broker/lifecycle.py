"""Job state changes: each one function, one transaction, with the job row locked."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlmodel import Session, select

from broker.db import begin_write, is_postgres
from broker.errors import NotFound
from broker.jobs import JobStatus, check_transition
from broker.ledger import release
from broker.models import Job

log = logging.getLogger(__name__)


def lock_job(session: Session, job_id: str, team_id: str | None = None) -> Job:
    """Load a job and hold its row for this transaction (FOR UPDATE on PostgreSQL)."""
    begin_write(session)
    statement = select(Job).where(Job.id == job_id)
    if is_postgres(session):
        statement = statement.with_for_update()
    job = session.exec(statement).first()
    if job is None or (team_id is not None and job.team_id != team_id):
        raise NotFound(f"job {job_id} not found")
    return job


def _finish(
    session: Session, job: Job, status: JobStatus, now: datetime, reason: str | None = None
) -> None:
    job.status = check_transition(job.status, status).value
    job.status_reason = reason
    job.updated_at = now
    job.finished_at = now
    release(session, job, now)
    session.add(job)


def cancel(session: Session, team_id: str, job_id: str, now: datetime) -> Job:
    """Cancel a team's unfinished job and release what it still has reserved (409 if finished)."""
    job = lock_job(session, job_id, team_id)
    _finish(session, job, JobStatus.CANCELLED, now, "cancelled by the team")
    session.commit()
    log.info("job cancelled", extra={"job_id": job.id, "team_id": team_id})
    return job
