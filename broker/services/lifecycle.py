"""Job state changes: each one function, one transaction, with the job row locked.

These functions touch only the database; what an attempt costs is worked out and booked by
``broker.services.billing``, inside their transactions. The runner
(``broker.services.runner``) calls the clouds between them: an attempt row is committed
before its instance is launched (its id is the launch's idempotency token), and an attempt
is marked ended before its instance is terminated, so a crash anywhere leaves either a
retryable launch or an orphan for reconcile. The functions that end attempts return the
instances the caller must terminate.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlmodel import Session, col, select

from broker.core.errors import BudgetExceeded, NotFound
from broker.core.job_status import JobStatus, check_transition, is_terminal
from broker.core.money import cost_micros
from broker.db.engine import begin_write, is_postgres
from broker.db.ids import new_id
from broker.db.models import Attempt, AttemptNode, Checkpoint, Job
from broker.faults import fault_point
from broker.services.billing import bill, billed_until, renew_lease, warn_on_alert
from broker.services.ledger import job_reserved, job_spent, lock_team, release, reserve
from broker.services.plans import ChosenPlan
from broker.services.teams import hash_token

log = logging.getLogger(__name__)

LAUNCHING, RUNNING, ENDED = "launching", "running", "ended"
MAX_LAUNCH_FAILURES = 8


@dataclass(frozen=True)
class ToTerminate:
    """An instance whose attempt has ended and that the caller must terminate."""

    attempt_id: str
    provider: str
    region: str
    zone: str
    instance_id: str


def lock_job(session: Session, job_id: str, team_id: str | None = None) -> Job:
    """Load a job and hold its row for this transaction (FOR UPDATE on PostgreSQL). The row
    is read afresh: a copy the session holds from an earlier transaction (another worker
    began an attempt since) is overwritten, not returned as it was."""
    begin_write(session)
    statement = select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    if is_postgres(session):
        statement = statement.with_for_update()
    job = session.exec(statement).first()
    if job is None or (team_id is not None and job.team_id != team_id):
        raise NotFound(f"job {job_id} not found")
    return job


def live_attempts(session: Session, job_id: str) -> list[Attempt]:
    """A job's attempts that have not ended (launching or running), read afresh: a copy the
    session holds from an earlier transaction (another worker booked it since) is
    overwritten, so an attempt ended here ends where its latest booking does."""
    return list(
        session.exec(
            select(Attempt).where(
                Attempt.job_id == job_id, col(Attempt.status).in_((LAUNCHING, RUNNING))
            ),
            execution_options={"populate_existing": True},
        ).all()
    )


def work_complete(job: Job) -> bool:
    """Whether a checkpoint holds all of a job's work. Reported work alone never does (an
    agent's word). A job succeeds on this or on its program's exit code 0
    (``program_exited``); every other success decision asks here."""
    return job.checkpointed_work >= job.total_work


def attempt_instances(session: Session, attempt: Attempt) -> list[ToTerminate]:
    """Every instance an attempt holds, as the instances to terminate when it ends: a gang's
    every launched node (``attempt_node``, rank order), else its one instance if launched."""
    return instances_of(session, [attempt])[attempt.id]


class AttemptPlace(Protocol):
    """What ``instances_of`` reads of an attempt: an ``Attempt``, or a row of its columns."""

    id: str
    provider: str
    region: str
    zone: str
    instance_id: str | None
    nodes: int


def instances_of(
    session: Session, attempts: Sequence[AttemptPlace]
) -> dict[str, list[ToTerminate]]:
    """``attempt_instances`` for many attempts: one query for every gang's nodes, none for
    single-node attempts."""
    nodes: dict[str, list[str]] = {}
    gangs = [attempt.id for attempt in attempts if attempt.nodes > 1]
    if gangs:
        rows = session.execute(
            select(AttemptNode.attempt_id, AttemptNode.instance_id)
            .where(col(AttemptNode.attempt_id).in_(gangs))
            .order_by(col(AttemptNode.attempt_id), col(AttemptNode.rank))
        ).all()
        for attempt_id, instance_id in rows:
            if instance_id:
                nodes.setdefault(attempt_id, []).append(instance_id)
    found: dict[str, list[ToTerminate]] = {}
    for attempt in attempts:
        ids = nodes.get(attempt.id, [])
        if attempt.instance_id and attempt.instance_id not in ids:
            ids.insert(0, attempt.instance_id)
        found[attempt.id] = [
            ToTerminate(attempt.id, attempt.provider, attempt.region, attempt.zone, instance_id)
            for instance_id in ids
        ]
    return found


def _end_attempt(
    session: Session, job: Job, attempt: Attempt, reason: str, now: datetime
) -> list[ToTerminate]:
    """Settle an attempt's spend up to ``now`` and mark it ended; returns every instance it
    holds (every node of a gang).

    It ends where its booking does when another process already booked it past ``now`` (a
    batch acting on an observation older than the tick's lease sweep): the instance ran at
    least that long, and an end before the time billed would show a run shorter than its
    bill."""
    end = now
    if attempt.status == RUNNING:
        bill(session, job, attempt, now)
        booked = billed_until(attempt)
        end = max(now, booked) if booked is not None else now
    attempt.status = ENDED
    attempt.end_reason = reason
    attempt.ended_at = end
    session.add(attempt)
    return attempt_instances(session, attempt)


def _move(job: Job, status: JobStatus, now: datetime, reason: str | None = None) -> None:
    # Staying in an unfinished status (provisioning again after a failed launch) is no move.
    if job.status != status.value or is_terminal(job.status):
        job.status = check_transition(job.status, status).value
    job.status_reason = reason
    job.updated_at = now


def completion_time(session: Session, job: Job, now: datetime) -> datetime:
    """When a job ending ``succeeded`` had its work observed complete: the first checkpoint
    holding all of it (its report's time), else ``now``, when its caller saw it complete (the
    program's exit 0 report)."""
    if job.checkpointed_work >= job.total_work:
        first = session.exec(
            select(Checkpoint.created_at)
            .where(Checkpoint.job_id == job.id, Checkpoint.work_done >= job.total_work)
            .order_by(col(Checkpoint.created_at))
        ).first()
        return min(first, now) if first is not None else now
    return now


def _finish(
    session: Session, job: Job, status: JobStatus, now: datetime, reason: str
) -> list[ToTerminate]:
    """End every live attempt, move to a terminal status, release what is still reserved.

    The status says how the work ended: whatever stop the caller asks for (budget, deadline,
    failure), a job whose work is complete ends ``succeeded`` (a cancel stays a cancel);
    ``completed_at`` records when the completion was observed (``deadline_met``).
    """
    if work_complete(job) and status not in (JobStatus.SUCCEEDED, JobStatus.CANCELLED):
        status, reason = JobStatus.SUCCEEDED, "work reached (checkpointed)"
    if status is JobStatus.SUCCEEDED or work_complete(job):
        job.completed_at = job.completed_at or completion_time(session, job, now)
    attempt_reason = "completed" if status is JobStatus.SUCCEEDED else "stopped"
    ended = [
        item
        for a in live_attempts(session, job.id)
        for item in _end_attempt(session, job, a, attempt_reason, now)
    ]
    _move(job, status, now, reason)
    job.finished_at = now
    session.flush()
    release(session, job, now)
    session.add(job)
    log.info("job %s: %s", status.value, reason, extra={"job_id": job.id, "team_id": job.team_id})
    return ended


def cancel(session: Session, team_id: str, job_id: str, now: datetime) -> list[ToTerminate]:
    """Cancel a team's unfinished job: settle its spend and release the rest (409 if finished)."""
    job = lock_job(session, job_id, team_id)
    ended = _finish(session, job, JobStatus.CANCELLED, now, "cancelled by the team")
    session.commit()
    return ended


def stop(
    session: Session, job_id: str, status: JobStatus, reason: str, now: datetime
) -> list[ToTerminate]:
    """Stop an unfinished job in a terminal ``status`` (budget, deadline, failure, success)."""
    job = lock_job(session, job_id)
    if is_terminal(job.status):
        session.rollback()
        return []
    ended = _finish(session, job, status, now, reason)
    session.flush()
    fault_point("mid_settle")
    session.commit()
    return ended


def begin_attempt(
    session: Session,
    job_id: str,
    plan: ChosenPlan,
    now: datetime,
    token_for: Callable[[str], str] | None = None,
    reserve_up_to: int | None = None,
    replacing: str | None = None,
) -> tuple[Attempt, str] | None:
    """Record a new attempt on ``plan`` (job -> provisioning) before anything is launched.

    ``plan`` becomes the job's plan; the attempt is billed at its hourly price.
    ``token_for(attempt_id)`` makes the attempt's agent token (default: random); only its
    hash is stored. ``reserve_up_to``: the plan's worst case; when the job holds less, the
    difference is reserved from its team's budget (BudgetExceeded if the team lacks it), so
    a re-planned attempt is as covered as the first. Returns the attempt and the token, or
    None when the job has finished or already has a live attempt.

    ``replacing``: the job's running attempt this one is to replace (make before break).
    It keeps running and the job keeps its status and plan until the new attempt runs
    (``launch_succeeded`` then ends it); a refused launch leaves it as it was. None when
    that attempt is not the job's only live one any more.
    """
    job = lock_job(session, job_id)
    live = live_attempts(session, job.id)
    if replacing is not None:
        wanted = [a.id for a in live if a.status == RUNNING] == [replacing] and len(live) == 1
    else:
        wanted = not live
    if is_terminal(job.status) or not wanted:
        session.rollback()
        return None
    if reserve_up_to is not None:
        held = job_reserved(session, job.id)
        wanted = min(reserve_up_to, job.max_cost_micros - job_spent(session, job.id))
        if wanted > held:
            try:
                reserve(session, lock_team(session, job.team_id), job, wanted - held, now)
            except BudgetExceeded:
                session.rollback()
                raise
    if replacing is None:
        _move(job, JobStatus.PROVISIONING, now)
        job.plan = plan.to_json()
        job.start_by = plan.start_by(job.deadline)
        job.work_done = job.checkpointed_work
    attempt_id = new_id("att")
    token = token_for(attempt_id) if token_for else "att_" + secrets.token_urlsafe(24)
    attempt = Attempt(
        id=attempt_id,
        job_id=job.id,
        team_id=job.team_id,
        provider=plan.provider,
        region=plan.region,
        zone=plan.zone,
        instance_type=plan.instance_type,
        gpu=plan.gpu,
        gpu_count=plan.gpu_count,
        nodes=plan.nodes,
        market=plan.market,
        price_micros_per_hour=plan.price_per_hour_micros,
        status=LAUNCHING,
        token_hash=hash_token(token),
        work_at_start=job.checkpointed_work,
        work_done=job.checkpointed_work,
        created_at=now,
    )
    session.add(job)
    session.add(attempt)
    session.commit()
    return attempt, token


def launch_succeeded(
    session: Session,
    attempt_id: str,
    instance_id: str,
    now: datetime,
    *,
    lease_seconds: float,
    plan: ChosenPlan | None = None,
) -> list[ToTerminate]:
    """The cloud has the instance (a gang: every node; ``instance_id`` is node 0's): attempt
    running from now on its first spend lease (up to ``lease_seconds``, within the job's
    money), job running. Returns what to terminate: the attempt's instance when it ended
    meanwhile; the attempt it replaces (``begin_attempt``'s ``replacing``), ended here, its
    spend settled before the new lease, the job on the new attempt from its latest
    checkpoint and on ``plan`` (the plan launched, when the caller has it)."""
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if attempt.status == RUNNING and attempt.instance_id == instance_id:
        # A repeated launch of the same attempt (its token found the same instance): done.
        session.rollback()
        return []
    if attempt.status != LAUNCHING:
        # The attempt ended while the launch was under way (cancel, stop): its instances go.
        gone = attempt_instances(session, attempt)
        session.rollback()
        here = ToTerminate(attempt.id, attempt.provider, attempt.region, attempt.zone, instance_id)
        return gone if here in gone else [here, *gone]
    if is_terminal(job.status):
        attempt.instance_id = instance_id
        ended = _end_attempt(session, job, attempt, "stopped", now)
        session.commit()
        return ended
    replaced = [a for a in live_attempts(session, job.id) if a.id != attempt.id]
    ended = [item for a in replaced for item in _end_attempt(session, job, a, "migrated", now)]
    # (preempted: the attempt it replaces was lost or preempted meanwhile)
    if replaced or job.status == JobStatus.PREEMPTED.value:
        if job.status == JobStatus.PREEMPTED.value:
            _move(job, JobStatus.PROVISIONING, now)
        # the new instance restores the latest checkpoint
        job.work_done = attempt.work_at_start = attempt.work_done = job.checkpointed_work
        if plan is not None:
            job.plan = plan.to_json()
            job.start_by = plan.start_by(job.deadline)
    attempt.instance_id = instance_id
    attempt.status = RUNNING
    attempt.started_at = now
    renew_lease(session, job, attempt, now, lease_seconds)
    _move(job, JobStatus.RUNNING, now)
    session.add_all([attempt, job])
    session.commit()
    return ended


def node_launched(
    session: Session, attempt_id: str, rank: int, instance_id: str, now: datetime
) -> list[ToTerminate]:
    """Node ``rank`` of a gang attempt has its instance: record it (committed, so a crash
    before the next node leaves every started instance known). Returns the instance to
    terminate when the attempt ended meanwhile (a cancel, a stop): empty otherwise."""
    attempt = locked_attempt(session, attempt_id)
    row = session.get(AttemptNode, (attempt_id, rank))
    if row is not None and row.instance_id == instance_id:
        session.rollback()  # a retried launch: the same token found the same instance
    else:
        if row is None:
            row = AttemptNode(attempt_id=attempt_id, rank=rank, created_at=now)
        row.instance_id = instance_id
        session.add(row)
        session.commit()
    if attempt.status == LAUNCHING:
        return []
    return [ToTerminate(attempt.id, attempt.provider, attempt.region, attempt.zone, instance_id)]


def launch_failed(session: Session, attempt_id: str, reason: str, now: datetime) -> int:
    """The launch was refused (capacity, quota, error): end the attempt.

    Returns how many launches of this job failed in a row; after MAX_LAUNCH_FAILURES the job
    fails.
    """
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if attempt.status == LAUNCHING:
        _end_attempt(session, job, attempt, reason, now)
    session.flush()
    failures = _consecutive_failures(session, job)
    if failures >= MAX_LAUNCH_FAILURES and not is_terminal(job.status):
        _finish(session, job, JobStatus.FAILED, now, f"{failures} launches failed in a row")
    session.commit()
    return failures


def _consecutive_failures(session: Session, job: Job) -> int:
    """The job's latest launches that failed, in a row. An ``auto`` job's spot launches
    refused for capacity are not failures: its policy waits for spot or takes on-demand in
    time (``steering.market_now``)."""
    attempts = session.exec(
        select(Attempt).where(Attempt.job_id == job.id).order_by(col(Attempt.id).desc())
    ).all()
    count = 0
    for attempt in attempts:
        if job.market == "auto" and attempt.market == "spot" and attempt.end_reason == "capacity":
            continue
        if attempt.end_reason not in ("capacity", "quota", "failed"):
            break
        count += 1
    return count


def locked_attempt(session: Session, attempt_id: str) -> Attempt:
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"attempt {attempt_id} not found")
    lock_job(session, attempt.job_id)
    session.refresh(attempt)
    return attempt


def _locked_running(session: Session, attempt_id: str) -> tuple[Attempt, Job] | None:
    """The attempt, its job locked (``locked_attempt``), while the attempt runs and the job
    has not finished; else None, the transaction rolled back (nothing to change)."""
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if attempt.status != RUNNING or is_terminal(job.status):
        session.rollback()
        return None
    return attempt, job


def preempted(
    session: Session, attempt_id: str, now: datetime, reason: str | None = None
) -> list[ToTerminate]:
    """The cloud took the instance back, or is about to (its agent got the notice, ``reason``
    says what it was): end the attempt now, fall back to the latest checkpoint. Returns the
    instance to terminate (one already gone is terminated again harmlessly)."""
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if attempt.status == ENDED:
        session.rollback()
        return []
    ended = _end_attempt(session, job, attempt, "preempted", now)
    stopped: list[ToTerminate] = []
    if is_terminal(job.status):
        pass
    elif work_complete(job):
        # The final checkpoint was saved before the cloud took the instance: done.
        stopped = _finish(session, job, JobStatus.SUCCEEDED, now, "work reached (checkpointed)")
    else:
        said = f": {reason}" if reason else ""
        _move(job, JobStatus.PREEMPTED, now, f"preempted in {attempt.zone}{said}")
        job.work_done = job.checkpointed_work
        session.add(job)
    session.commit()
    return [*ended, *stopped]


def program_exited(
    session: Session, attempt_id: str, exit_code: int, tail: str, now: datetime
) -> list[ToTerminate]:
    """The training program exited (its agent says so; ``tail``: its last output).

    0: the job succeeded. Otherwise the attempt ends (end reason ``exit code N``, the code
    kept) and the job goes back to provisioning, to relaunch from its latest checkpoint,
    while its error restarts (attempts that exited non-zero before this one) are fewer than
    the spec's ``max_restarts_on_errors``; else it fails with the code and the tail's last
    lines. A checkpoint holding all the work makes it a success whatever the code. An ended
    attempt changes nothing. Returns the instances to terminate.
    """
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if attempt.status == ENDED or is_terminal(job.status):
        session.rollback()
        return []
    attempt.exit_code = exit_code
    if exit_code == 0:
        ended = _finish(session, job, JobStatus.SUCCEEDED, now, "program exited 0")
        session.commit()
        return ended
    code = f"exit code {exit_code}"
    gone = _end_attempt(session, job, attempt, code, now)
    stopped: list[ToTerminate] = []
    session.flush()
    restarts = _failed_exits(session, job.id) - 1  # this exit is not a restart (yet)
    allowed = int(job.spec.get("max_restarts_on_errors") or 0)
    if work_complete(job):
        stopped = _finish(session, job, JobStatus.SUCCEEDED, now, "work reached (checkpointed)")
    elif restarts < allowed:
        restart = f"restart {restarts + 1} of {allowed}"
        _move(
            job,
            JobStatus.PROVISIONING,
            now,
            f"{code}: restarting from the latest checkpoint ({restart})",
        )
        job.work_done = job.checkpointed_work
        session.add(job)
    else:
        stopped = _finish(session, job, JobStatus.FAILED, now, exit_summary(exit_code, tail))
    session.commit()
    return [*gone, *stopped]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colours and cursor moves in program output
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def exit_summary(exit_code: int, tail: str, lines: int = 3, limit: int = 500) -> str:
    """``exit code N: <the tail's last non-empty lines, joined with " | ">``, without control
    characters, cut to ``limit`` characters (a job's status reason)."""
    kept = [_CONTROL.sub("", _ANSI.sub("", line)).strip() for line in tail.splitlines()]
    last = [line for line in kept if line][-lines:]
    summary = f"exit code {exit_code}" + (": " + " | ".join(last) if last else "")
    return summary[:limit]


def _failed_exits(session: Session, job_id: str) -> int:
    """How many of a job's attempts ended with their program exiting non-zero."""
    return len(
        session.exec(
            select(Attempt.id).where(
                Attempt.job_id == job_id,
                col(Attempt.exit_code).is_not(None),
                Attempt.exit_code != 0,
            )
        ).all()
    )


def lost(
    session: Session,
    attempt_id: str,
    now: datetime,
    reason: str,
    *,
    silent_since: datetime | None = None,
) -> list[ToTerminate]:
    """A running attempt's agent fell silent: end the attempt (billed to ``now``, end reason
    ``lost``) and let the job wait for a relaunch from its latest checkpoint, as ``preempted``
    (the status for an attempt taken from a job against its will; the next tick relaunches
    it). ``silent_since``: when the caller last saw the agent heard; a call accepted after
    it means the agent is back, and nothing changes. Returns the instance to terminate."""
    attempt = locked_attempt(session, attempt_id)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    heard = attempt.last_heard_at
    back = silent_since is not None and heard is not None and heard > silent_since
    if attempt.status != RUNNING or is_terminal(job.status) or back:
        session.rollback()
        return []
    ended = _end_attempt(session, job, attempt, "lost", now)
    stopped: list[ToTerminate] = []
    if work_complete(job):
        stopped = _finish(session, job, JobStatus.SUCCEEDED, now, "work reached (checkpointed)")
    else:
        _move(job, JobStatus.PREEMPTED, now, reason)
        job.work_done = job.checkpointed_work
        session.add(job)
    session.commit()
    return [*ended, *stopped]


def migrate(session: Session, attempt_id: str, reason: str, now: datetime) -> list[ToTerminate]:
    """Leave a running attempt on purpose (e.g. spot -> on-demand): job back to provisioning."""
    running = _locked_running(session, attempt_id)
    if running is None:
        return []
    attempt, job = running
    ended = _end_attempt(session, job, attempt, "migrated", now)
    _move(job, JobStatus.PROVISIONING, now, reason)
    job.work_done = job.checkpointed_work
    session.add(job)
    session.commit()
    return ended


def lease_lapsed(
    session: Session, attempt_id: str, now: datetime, lookahead_seconds: float
) -> list[ToTerminate]:
    """The attempt's agent stopped its program because no progress ack renewed its spend
    lease in time: the attempt ends now as a lapsed lease does in ``accrue`` (spend booked
    to the lease's end, the rest as an overrun), without waiting for the lease sweep to
    find it. An ended attempt changes nothing. Returns the instances to terminate."""
    running = _locked_running(session, attempt_id)
    if running is None:
        return []
    attempt, job = running
    return _lapse(session, job, attempt, now, lookahead_seconds)


def _lapse(
    session: Session, job: Job, attempt: Attempt, now: datetime, lookahead_seconds: float
) -> list[ToTerminate]:
    """End a running attempt whose lease lapsed (end reason ``lease``) and commit: the job
    succeeds when its checkpoints hold all the work, stops as budget_exhausted when its
    money cannot pay for the next ``lookahead_seconds``, else relaunches from its latest
    checkpoint."""
    lapsed = attempt.lease_until.isoformat() if attempt.lease_until else "-"
    ended = _end_attempt(session, job, attempt, "lease", now)
    session.flush()
    left = job.max_cost_micros - job_spent(session, job.id)
    stopped: list[ToTerminate] = []
    if work_complete(job):
        stopped = _finish(session, job, JobStatus.SUCCEEDED, now, "work reached (checkpointed)")
    elif left < cost_micros(attempt.price_micros_per_hour, lookahead_seconds):
        reason = f"max_cost reached: its spend lease ended at {lapsed}"
        stopped = _finish(session, job, JobStatus.BUDGET_EXHAUSTED, now, reason)
    else:
        _move(job, JobStatus.PREEMPTED, now, f"spend lease lapsed at {lapsed}: stopped")
        job.work_done = job.checkpointed_work
        session.add(job)
    session.commit()
    return [*ended, *stopped]


def accrue(
    session: Session,
    attempt_id: str,
    now: datetime,
    lookahead_seconds: float,
    *,
    lease_seconds: float,
) -> list[ToTerminate]:
    """Book a running attempt's spend to ``now`` and renew its lease; stop what may not run on.

    A lease that lapsed before this call (the loop fell behind) ends the attempt: spend is
    booked to the lease's end, the rest as an overrun, and the job relaunches from its latest
    checkpoint. Otherwise the lease is renewed up to ``lease_seconds`` within the job's money;
    when that money does not cover the next ``lookahead_seconds``, the job stops as
    budget_exhausted.
    """
    running = _locked_running(session, attempt_id)
    if running is None:
        return []
    attempt, job = running
    if attempt.lease_until is not None and now > attempt.lease_until:
        return _lapse(session, job, attempt, now, lookahead_seconds)
    booked = bill(session, job, attempt, now)
    session.flush()
    if booked:
        warn_on_alert(session, job, booked, now)
    if renew_lease(session, job, attempt, now, max(lease_seconds, lookahead_seconds)) < (
        lookahead_seconds
    ):
        ended = _finish(
            session,
            job,
            JobStatus.BUDGET_EXHAUSTED,
            now,
            "max_cost would be exceeded before the next check",
        )
        session.commit()
        return ended
    session.commit()
    return []
