"""What a training instance tells the broker, checked before it counts: the agent route's call.

An agent (or anyone holding its token) must not be able to end a job, reach another team's
data or spend money by what it reports. Every agent call starts with ``checked_attempt``,
which refuses foreign tokens, ended attempts and expired tokens and notes when the attempt
was last heard from (silence detection); ``record_progress`` also refuses checkpoint keys
outside the job's prefix, and this module adds the bound on work: no more than the
attempt's GPUs could have done since it started, at the throughput model's speed times
``progress_speed_margin`` (``broker.core.progress``). Reported work never finishes a job by
itself: only a checkpoint holding all of it, or the program's exit 0, does
(``lifecycle.work_complete``, ``lifecycle.program_exited``).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import datetime

import numpy as np
from sqlmodel import Session, col, select

from broker.core.agent_tokens import expires_at
from broker.core.checkpoint_keys import checked_checkpoint_key
from broker.core.errors import BrokerError, Conflict, NotFound, Unauthorized
from broker.core.job_status import is_terminal
from broker.core.progress import check_credible, credible_work
from broker.core.throughput import Workload
from broker.db.ids import new_id
from broker.db.models import Attempt, Checkpoint, Job
from broker.services import lifecycle
from broker.services.job_spec import JobSpec
from broker.services.quoting import Planning, get_planning
from broker.services.teams import hash_token
from broker.settings import Settings, get_settings


def top_speed(planning: Planning, session: Session, job: Job, attempt: Attempt) -> float:
    """The fastest work per hour the attempt's GPUs are predicted to run the job at: with the
    learnt throughput correction, or without it when that is faster (a correction learnt
    from a slow host must not lock out an honest, faster instance). A gang (whose node 0
    reports the whole gang's work) may scale linearly: nodes x one machine's speed, or its
    own learnt speed when faster."""
    corrected = planning.rate(session, job, attempt.gpu, attempt.gpu_count)
    spec = JobSpec.model_validate(job.spec)
    workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
    model = planning.model.work_per_hour(
        workload, np.array([attempt.gpu]), np.array([attempt.gpu_count])
    )
    fastest = max(corrected, float(model[0]))
    if attempt.nodes <= 1:
        return fastest
    gang = planning.rate(session, job, attempt.gpu, attempt.gpu_count, attempt.nodes)
    return max(gang, fastest * attempt.nodes)


def report_progress(
    session: Session,
    attempt_id: str,
    token: str,
    work_done: float,
    checkpoint_key: str | None,
    now: datetime,
    *,
    planning: Planning | None = None,
    settings: Settings | None = None,
) -> Job:
    """Record an agent's report for its attempt, or refuse it changing nothing: a wrong token
    (404), an ended attempt (409), an expired token (401), a checkpoint key outside
    ``jobs/{job_id}/`` or more work than credible by ``now`` (422 naming the field)."""
    planning = planning or get_planning()
    settings = settings or get_settings()

    def credible(job: Job, attempt: Attempt) -> float:
        speed = top_speed(planning, session, job, attempt) * settings.progress_speed_margin
        return credible_work(
            attempt.work_at_start, attempt.started_at, now, speed, settings.progress_skew_seconds
        )

    return record_progress(
        session, attempt_id, token, work_done, checkpoint_key, now, credible=credible
    )


def record_progress(
    session: Session,
    attempt_id: str,
    token: str,
    work_done: float,
    checkpoint_key: str | None,
    now: datetime,
    *,
    credible: Callable[[Job, Attempt], float] | None = None,
) -> Job:
    """A training instance reports work done (and maybe a saved checkpoint) for its attempt.

    Refused, changing nothing: what ``checked_attempt`` refuses, a checkpoint key outside
    the job's prefix (``checkpoint_keys``) and, given ``credible`` (the most work the attempt
    can have done by ``now``; the agent route always gives it), more work than that
    (InvalidInput naming ``work_done``). Less work than reported before is kept as it was.
    An accepted report is also the agent's heartbeat (``Attempt.last_heard_at``).
    """
    attempt, job = checked_attempt(session, attempt_id, token, now)
    try:
        key = None if checkpoint_key is None else checked_checkpoint_key(job.id, checkpoint_key)
        if credible is not None:
            check_credible(work_done, credible(job, attempt), now)
    except BrokerError:
        session.rollback()
        raise
    work = min(max(work_done, attempt.work_done), job.total_work)
    attempt.work_done = work
    job.work_done = max(job.work_done, work)
    if key is not None:
        saved = min(work_done, job.total_work)  # what this checkpoint holds, not the most yet
        session.add(
            Checkpoint(
                id=new_id("ckpt"),
                job_id=job.id,
                attempt_id=attempt.id,
                work_done=saved,
                object_key=key,
                created_at=now,
            )
        )
        job.checkpointed_work = max(job.checkpointed_work, saved)
    job.updated_at = now
    session.add_all([attempt, job])
    session.commit()
    return job


def checked_attempt(
    session: Session, attempt_id: str, token: str, now: datetime
) -> tuple[Attempt, Job]:
    """The attempt ``token`` speaks for, its job row locked, marked heard at ``now``; the
    caller commits. Every agent call starts here. Refused, changing nothing: a token that is
    not the attempt's (NotFound), an ended attempt or finished job (Conflict), an expired
    token (Unauthorized)."""
    attempt = lifecycle.locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    try:
        if not hmac.compare_digest(attempt.token_hash, hash_token(token)):
            raise NotFound(f"attempt {attempt_id} not found")
        if attempt.status == lifecycle.ENDED or is_terminal(job.status):
            raise Conflict(f"attempt {attempt_id} has ended")
        expiry = expires_at(token)
        if expiry is not None and now >= expiry:
            raise Unauthorized(f"attempt {attempt_id}'s token expired at {expiry.isoformat()}")
    except BrokerError:
        session.rollback()
        raise
    if attempt.last_heard_at is None or attempt.last_heard_at < now:
        attempt.last_heard_at = now
    session.add(attempt)
    return attempt, job


def heard(session: Session, attempt_id: str, token: str, now: datetime) -> tuple[Attempt, Job]:
    """An agent call that changes nothing else: check its token (``checked_attempt``) and
    note that its attempt was heard from at ``now``."""
    attempt, job = checked_attempt(session, attempt_id, token, now)
    session.commit()
    return attempt, job


def latest_checkpoint(session: Session, job_id: str) -> Checkpoint | None:
    """The checkpoint holding the most work for a job."""
    return session.exec(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(col(Checkpoint.work_done).desc(), col(Checkpoint.id).desc())
    ).first()
