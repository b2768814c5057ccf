"""What the broker hands a training instance's agent, and what it keeps of what the agent sends.

The agent asks for its run spec (the program, its environment, presigned URLs for the
workdir and the checkpoint to restore), for a place to upload each checkpoint (a presigned
PUT under ``jobs/{job_id}/checkpoints/{attempt_id}/``), sends the program's output in chunks
(``jobs/{job_id}/logs/{attempt_id}/{seq:06d}.log``, up to ``agent_log_limit_bytes`` per
attempt) and says when the program exited or the cloud gave notice. Every call is checked
first (``agent_reports.checked_attempt``: the attempt's own token, not ended, not expired)
and counts as the agent's heartbeat. Job state changes are ``lifecycle``'s; the caller
terminates and relaunches what they return (``AgentEnd``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlmodel import Session, func, select

from broker import clock
from broker.core.checkpoint_keys import checkpoint_prefix
from broker.core.errors import Conflict
from broker.core.job_status import JobStatus, is_terminal
from broker.db.models import Attempt, Checkpoint
from broker.services import agent_reports, lifecycle
from broker.services.calibration import calibrate
from broker.services.lifecycle import ToTerminate
from broker.services.quoting import get_planning
from broker.services.spend_control import SpendControls
from broker.settings import Settings, get_settings
from providers.registry import build_checkpoint_store
from providers.storage import S3CheckpointStore

log = logging.getLogger(__name__)

PRESIGN_SECONDS = 3600.0
"""Wall seconds a presigned URL works: long enough for a large checkpoint's upload."""
NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0}
"""Broker seconds between a spot preemption notice and the reclaim, per cloud."""
MIN_REPORT_SECONDS = 1.0
"""Wall seconds an agent waits at least between reports, however fast the broker's clock."""


@lru_cache
def get_store() -> S3CheckpointStore:
    """The process-wide checkpoint store (``settings.checkpoint_bucket``)."""
    return build_checkpoint_store(get_settings())


@dataclass(frozen=True)
class RunSpec:
    """Everything an agent needs to run its attempt's program (protocol section 3)."""

    attempt_id: str
    job_id: str
    provider: str
    command: str
    setup: str | None
    image: str | None
    env: dict[str, str]
    workdir: dict[str, str] | None
    restore: dict[str, str] | None
    workload: dict[str, Any]
    work_unit: str
    total_work: float
    start_work: float
    gpu: str
    gpu_count: int
    clock_scale: float
    report_seconds: float
    log_flush_seconds: float
    log_limit_bytes: int
    notice_seconds: float
    lease_seconds_left: float


@dataclass(frozen=True)
class ProgressAck:
    """The answer to a progress report: where the job stands, whether to stop, the lease."""

    job_status: str
    work_done: float
    total_work: float
    should_stop: bool
    lease_seconds_left: float


@dataclass(frozen=True)
class Upload:
    """A place for one object: its key and a presigned PUT URL."""

    key: str
    url: str


@dataclass(frozen=True)
class LogAck:
    accepted_bytes: int
    truncated: bool


@dataclass(frozen=True)
class AgentEnd:
    """What an exit or a preemption notice did: the job's status, the instances to terminate
    and whether the job waits for a new attempt now (launch it at once)."""

    job_id: str
    job_status: str
    terminate: list[ToTerminate] = field(default_factory=list)
    relaunch: bool = False


def run_spec(
    session: Session,
    store: S3CheckpointStore,
    attempt_id: str,
    token: str,
    now: datetime,
    *,
    settings: Settings | None = None,
) -> RunSpec:
    """The attempt's run spec from its job's stored spec (``run``), with presigned GET URLs
    for the latest checkpoint and a workdir in the team's own ``workdirs/`` folder.
    Conflict when the job has no program to run (submitted before jobs carried one)."""
    settings = settings or get_settings()
    attempt, job = agent_reports.heard(session, attempt_id, token, now)
    run = job.spec.get("run") or {}
    if not run.get("command"):
        raise Conflict(f"job {job.id} has no run.command: there is no program to run")
    latest = agent_reports.latest_checkpoint(session, job.id)
    restore = None
    if latest is not None:
        restore = {
            "key": latest.object_key,
            "url": store.presigned_get(latest.object_key, PRESIGN_SECONDS),
        }
    workload = dict(job.spec["workload"])
    scale = clock.scale()
    return RunSpec(
        attempt_id=attempt.id,
        job_id=job.id,
        provider=attempt.provider,
        command=run["command"],
        setup=run.get("setup"),
        image=run.get("image"),
        env=dict(run.get("env") or {}),
        workdir=workdir_source(run.get("workdir"), store, job.team_id),
        restore=restore,
        workload=workload,
        work_unit="reference_gpu_hours" if "reference_gpu_hours" in workload else "steps",
        total_work=job.total_work,
        start_work=attempt.work_at_start,
        gpu=attempt.gpu,
        gpu_count=attempt.gpu_count,
        clock_scale=scale,
        report_seconds=report_wall_seconds(settings.agent_report_seconds, scale),
        log_flush_seconds=settings.agent_log_flush_seconds,
        log_limit_bytes=settings.agent_log_limit_bytes,
        notice_seconds=NOTICE_SECONDS.get(attempt.provider, 30.0) / scale,
        lease_seconds_left=lease_seconds_left(attempt, now, settings),
    )


def report_wall_seconds(report_seconds: float, scale: float) -> float:
    """Wall seconds between an agent's reports: ``report_seconds`` of broker time at clock
    ``scale``, never less than MIN_REPORT_SECONDS."""
    return max(report_seconds / scale, MIN_REPORT_SECONDS)


def workdir_source(
    workdir: str | None, store: S3CheckpointStore, team_id: str
) -> dict[str, str] | None:
    """Where the agent fetches the workdir: a presigned GET for an object in the team's own
    ``workdirs/{team_id}/`` folder of the broker's bucket, else the ``s3://`` URI as given
    (the instance needs its own access) or the ``https://`` URL."""
    if not workdir:
        return None
    bucket = f"s3://{store.bucket}/"
    own = f"{bucket}workdirs/{team_id}/"
    name = workdir.removeprefix(own) if workdir.startswith(own) else ""
    # One plain name in the folder: a key with "/" or ".." could name another team's object.
    if name and "/" not in name and name not in (".", "..") and name.isprintable():
        return {"url": store.presigned_get(workdir.removeprefix(bucket), PRESIGN_SECONDS)}
    if workdir.startswith("s3://"):
        return {"s3": workdir}
    return {"url": workdir}


def lease_seconds_left(attempt: Attempt, now: datetime, settings: Settings) -> float:
    """Broker seconds until the attempt's spend lease ends; before its launch is recorded
    (no lease yet), the lease a launch grants."""
    if attempt.lease_until is None:
        controls = SpendControls(
            lease_seconds=settings.lease_seconds, lease_ticks=settings.lease_ticks
        )
        return controls.lease(settings.tick_seconds * clock.nominal_scale())
    return max(0.0, (attempt.lease_until - now).total_seconds())


def acknowledge_progress(
    session: Session,
    attempt_id: str,
    token: str,
    work_done: float,
    checkpoint_key: str | None,
    now: datetime,
    *,
    settings: Settings | None = None,
) -> ProgressAck:
    """Record a progress report (``agent_reports.report_progress``: the heartbeat) and say
    whether the agent should stop and how long its lease lasts."""
    settings = settings or get_settings()
    job = agent_reports.report_progress(
        session, attempt_id, token, work_done, checkpoint_key, now, settings=settings
    )
    attempt = session.get(Attempt, attempt_id)
    assert attempt is not None
    return ProgressAck(
        job_status=job.status,
        work_done=job.work_done,
        total_work=job.total_work,
        should_stop=is_terminal(job.status) or attempt.status == lifecycle.ENDED,
        lease_seconds_left=lease_seconds_left(attempt, now, settings),
    )


def checkpoint_upload(
    session: Session,
    store: S3CheckpointStore,
    attempt_id: str,
    token: str,
    work_done: float,
    now: datetime,
) -> Upload:
    """A key for the attempt's next checkpoint, ``jobs/{job_id}/checkpoints/{attempt_id}/
    {work_done:.6g}-{n}.tar.gz`` (``n``: one more than the checkpoints it has reported, so a
    reported one is never overwritten), and a presigned PUT URL for it."""
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    reported = session.exec(
        select(func.count()).select_from(Checkpoint).where(Checkpoint.attempt_id == attempt.id)
    ).one()
    session.commit()
    key = (
        f"{checkpoint_prefix(job.id)}checkpoints/{attempt.id}/{work_done:.6g}-{reported + 1}.tar.gz"
    )
    return Upload(key=key, url=store.presigned_put(key, PRESIGN_SECONDS))


def log_key(job_id: str, attempt_id: str, seq: int) -> str:
    """The object holding chunk ``seq`` of an attempt's log (chunks concatenate in order)."""
    return f"{checkpoint_prefix(job_id)}logs/{attempt_id}/{seq:06d}.log"


def cut_log(data: bytes, stored: int, limit: int) -> tuple[bytes, int, bool]:
    """What to store of a chunk ``data`` when ``stored`` bytes of the log are kept already:
    (bytes to store, bytes of ``data`` accepted, truncated). The chunk that passes ``limit``
    keeps what fits (whole characters) and one line ``[broker: log truncated after N
    bytes]``; the stored log is then over ``limit``, which drops every later chunk."""
    if stored > limit:
        return b"", 0, True
    room = limit - stored
    if len(data) <= room:
        return data, len(data), False
    kept = data[:room].decode("utf-8", "ignore").encode()
    newline = b"\n" if kept and not kept.endswith(b"\n") else b""
    marker = f"[broker: log truncated after {stored + len(kept)} bytes]\n".encode()
    return kept + newline + marker, len(kept), True


def store_log(
    session: Session,
    store: S3CheckpointStore,
    attempt_id: str,
    token: str,
    text: str,
    now: datetime,
    *,
    settings: Settings | None = None,
) -> LogAck:
    """Keep one chunk of the program's output: its number and size are reserved in a short
    transaction, then the object is written (outside it, so a slow store holds no lock)."""
    settings = settings or get_settings()
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    chunk, accepted, truncated = cut_log(
        text.encode("utf-8"), attempt.log_bytes, settings.agent_log_limit_bytes
    )
    seq = attempt.log_chunks
    if chunk:
        attempt.log_chunks += 1
        attempt.log_bytes += len(chunk)
        session.add(attempt)
    session.commit()
    if chunk:
        store.put(log_key(job.id, attempt.id, seq), chunk)
    return LogAck(accepted_bytes=accepted, truncated=truncated)


_WAITING = (JobStatus.PROVISIONING.value, JobStatus.PREEMPTED.value)


def program_exited(
    session: Session, attempt_id: str, token: str, exit_code: int, tail: str, now: datetime
) -> AgentEnd:
    """The agent says its program exited: ``lifecycle.program_exited`` decides (success,
    restart from the latest checkpoint, or failure)."""
    attempt, job = agent_reports.heard(session, attempt_id, token, now)
    terminate = lifecycle.program_exited(session, attempt.id, exit_code, tail, now)
    _learn_speed(session, attempt.id)
    session.refresh(job)
    log.info(
        "program exited %s: job %s",
        exit_code,
        job.status,
        extra={"job_id": job.id, "attempt_id": attempt.id},
    )
    return AgentEnd(job.id, job.status, terminate, relaunch=job.status in _WAITING)


def preemption_notice(
    session: Session, attempt_id: str, token: str, reason: str, now: datetime
) -> AgentEnd:
    """The agent got the cloud's preemption notice, stopped the program and saved what it
    could: the attempt ends now (billing stops) through ``lifecycle.preempted``."""
    attempt, job = agent_reports.heard(session, attempt_id, token, now)
    terminate = lifecycle.preempted(session, attempt.id, now, reason or None)
    _learn_speed(session, attempt.id)
    session.refresh(job)
    log.info(
        "preemption notice: %s",
        reason,
        extra={"job_id": job.id, "attempt_id": attempt.id, "zone": attempt.zone},
    )
    return AgentEnd(job.id, job.status, terminate, relaunch=job.status in _WAITING)


def _learn_speed(session: Session, attempt_id: str) -> None:
    """Fold the ended attempt's speed into the throughput corrections, as the runner does for
    the attempts it ends; what the agent reported is already committed, so a failure here is
    logged, never the agent's error."""
    try:
        calibrate(get_planning(), session, attempt_id)
    except Exception:  # the exit is recorded; a correction missed is learnt from the next
        session.rollback()
        log.exception("calibration failed", extra={"attempt_id": attempt_id})
