"""What the broker hands a training instance's agent, and what it keeps of what the agent sends.

The agent asks for its run spec (the program, its environment, presigned URLs for the
workdir and the checkpoint to restore), for a place to upload each checkpoint (a presigned
PUT under ``jobs/{job_id}/checkpoints/{attempt_id}/``), sends the program's output in chunks
(``jobs/{job_id}/logs/{attempt_id}/{seq:06d}.log``, up to ``agent_log_limit_bytes`` per
attempt) and says when the program exited or the cloud gave notice. Every call is checked
first (``agent_reports.checked_attempt``: the attempt's own token, not ended, not expired)
and counts as the agent's heartbeat. Job state changes are ``lifecycle``'s; the caller
terminates and relaunches what they return (``AgentEnd``).

A gang's nodes share the attempt and its token and name their rank (``node``): node 0 reports
the rendezvous (``rendezvous``: ``Attempt.master_addr``/``master_port``, handed to the others
in their run spec's ``gang``), the work and the checkpoints; the others' progress is a
heartbeat, their logs go under ``node{k}/``, their non-zero exit ends the attempt, and a
notice from any node ends it as preempted.
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
from broker.core.errors import Conflict, InvalidInput
from broker.core.job_status import JobStatus, is_terminal
from broker.db.models import Attempt, Checkpoint, Job
from broker.services import agent_reports, lifecycle
from broker.services.calibration import calibrate
from broker.services.lifecycle import ToTerminate
from broker.services.quoting import get_planning
from broker.services.spend_control import SpendControls, lookahead_seconds
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
    gang: Gang | None = None


@dataclass(frozen=True)
class Gang:
    """Where a gang node stands: its rank, the gang's size and the rendezvous node 0 reported
    (None until it has)."""

    node_rank: int
    nodes: int
    master_addr: str | None
    master_port: int | None


def checked_node(attempt: Attempt, node: int, location: str = "query") -> int:
    """``node`` when it is one of the attempt's ranks (0 for a single-node attempt), else
    InvalidInput naming ``node`` (in the ``query`` or the ``body``)."""
    nodes = max(attempt.nodes, 1)
    if not 0 <= node < nodes:
        raise InvalidInput(
            f"node must be a rank of attempt {attempt.id}'s {nodes} node(s): 0..{nodes - 1}",
            field="node",
            location=location,
        )
    return node


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
    node: int = 0,
    settings: Settings | None = None,
) -> RunSpec:
    """The attempt's run spec from its job's stored spec (``run``), with presigned GET URLs
    for the latest checkpoint and a workdir in the team's own ``workdirs/`` folder; for a
    gang, ``gang`` says node ``node``'s rank and the rendezvous (InvalidInput naming ``node``
    for a rank the attempt does not have). Conflict when the job has no program to run."""
    settings = settings or get_settings()
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    try:
        checked_node(attempt, node)
    except InvalidInput:
        session.rollback()
        raise
    session.commit()
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
        gang=None
        if attempt.nodes <= 1
        else Gang(node, attempt.nodes, attempt.master_addr, attempt.master_port),
    )


def rendezvous(
    session: Session, attempt_id: str, token: str, node: int, addr: str, port: int, now: datetime
) -> Gang:
    """Node 0 of a gang says where its program's rendezvous listens (``addr``:``port``): kept
    on the attempt for the other nodes' run specs. InvalidInput naming ``node`` when the
    caller is not node 0 of a gang (a single-node attempt has no rendezvous)."""
    attempt, _ = agent_reports.checked_attempt(session, attempt_id, token, now)
    if node != 0 or attempt.nodes <= 1:
        session.rollback()
        what = "a single-node attempt has none" if attempt.nodes <= 1 else f"not node {node}"
        raise InvalidInput(f"only node 0 of a gang reports the rendezvous: {what}", "node")
    attempt.master_addr, attempt.master_port = addr, port
    session.add(attempt)
    session.commit()
    log.info(
        "gang rendezvous at %s:%s",
        addr,
        port,
        extra={"job_id": attempt.job_id, "attempt_id": attempt.id},
    )
    return Gang(0, attempt.nodes, addr, port)


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
    node: int = 0,
    settings: Settings | None = None,
) -> ProgressAck:
    """Record a progress report (``agent_reports.report_progress``: the heartbeat) and say
    whether the agent should stop and how long its lease lasts. A gang's node ``node`` >= 1
    only heartbeats: its work is not recorded and a checkpoint key from it is refused
    (InvalidInput naming ``checkpoint_key``): node 0 alone speaks for the gang's progress."""
    settings = settings or get_settings()
    if node == 0:
        job = agent_reports.report_progress(
            session, attempt_id, token, work_done, checkpoint_key, now, settings=settings
        )
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
    else:
        attempt, job = _node_call(session, attempt_id, token, node, now)
        if checkpoint_key is not None:
            session.rollback()
            raise InvalidInput(
                f"only node 0 reports checkpoints, not node {node}", "checkpoint_key"
            )
        session.commit()
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
    *,
    node: int = 0,
) -> Upload:
    """A key for the attempt's next checkpoint, ``jobs/{job_id}/checkpoints/{attempt_id}/
    {work_done:.6g}-{n}.tar.gz`` (``n``: one more than the checkpoints it has reported, so a
    reported one is never overwritten), and a presigned PUT URL for it. Node 0 only (a
    gang's other nodes: InvalidInput naming ``node``)."""
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    if node != 0:
        session.rollback()
        raise InvalidInput(f"only node 0 uploads checkpoints, not node {node}", "node")
    reported = session.exec(
        select(func.count()).select_from(Checkpoint).where(Checkpoint.attempt_id == attempt.id)
    ).one()
    session.commit()
    key = (
        f"{checkpoint_prefix(job.id)}checkpoints/{attempt.id}/{work_done:.6g}-{reported + 1}.tar.gz"
    )
    return Upload(key=key, url=store.presigned_put(key, PRESIGN_SECONDS))


def log_key(job_id: str, attempt_id: str, seq: int, node: int = 0) -> str:
    """The object holding chunk ``seq`` of an attempt's log (chunks concatenate in order);
    a gang's node ``node`` >= 1 keeps its own under ``node{node}/``."""
    folder = f"node{node}/" if node else ""
    return f"{checkpoint_prefix(job_id)}logs/{attempt_id}/{folder}{seq:06d}.log"


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
    node: int = 0,
    settings: Settings | None = None,
) -> LogAck:
    """Keep one chunk of node ``node``'s output: its number and size are reserved in a short
    transaction, then the object is written (outside it, so a slow store holds no lock). A
    gang's nodes number their chunks in one sequence and share one log limit, the limit
    times the node count."""
    settings = settings or get_settings()
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    try:
        checked_node(attempt, node)
    except InvalidInput:
        session.rollback()
        raise
    limit = settings.agent_log_limit_bytes * max(attempt.nodes, 1)
    chunk, accepted, truncated = cut_log(text.encode("utf-8"), attempt.log_bytes, limit)
    seq = attempt.log_chunks
    if chunk:
        attempt.log_chunks += 1
        attempt.log_bytes += len(chunk)
        session.add(attempt)
    session.commit()
    if chunk:
        store.put(log_key(job.id, attempt.id, seq, node), chunk)
    return LogAck(accepted_bytes=accepted, truncated=truncated)


_WAITING = (JobStatus.PROVISIONING.value, JobStatus.PREEMPTED.value)


def _node_call(
    session: Session, attempt_id: str, token: str, node: int, now: datetime
) -> tuple[Attempt, Job]:
    """``checked_attempt`` for a call from node ``node`` (checked to be one of the attempt's
    ranks, InvalidInput naming the body's ``node`` otherwise); the caller commits."""
    attempt, job = agent_reports.checked_attempt(session, attempt_id, token, now)
    try:
        checked_node(attempt, node, "body")
    except InvalidInput:
        session.rollback()
        raise
    return attempt, job


def program_exited(
    session: Session,
    attempt_id: str,
    token: str,
    exit_code: int,
    tail: str,
    now: datetime,
    *,
    node: int = 0,
) -> AgentEnd:
    """The agent says its program exited: ``lifecycle.program_exited`` decides (success,
    restart from the latest checkpoint, or failure). On a gang's node ``node`` >= 1 a
    non-zero code ends the attempt the same way (its tail's lines prefixed ``node N:``), and
    0 is only logged: node 0's exit is the gang's."""
    attempt, job = _node_call(session, attempt_id, token, node, now)
    session.commit()
    if node != 0 and exit_code == 0:
        log.info(
            "node %s's program exited 0",
            node,
            extra={"job_id": job.id, "attempt_id": attempt.id},
        )
        return AgentEnd(job.id, job.status)
    if node != 0:
        tail = "".join(f"node {node}: {line}" for line in tail.splitlines(True))[-4096:]
    terminate = lifecycle.program_exited(session, attempt.id, exit_code, tail, now)
    _learn_speed(session, attempt.id)
    session.refresh(job)
    log.info(
        "node %s's program exited %s: job %s",
        node,
        exit_code,
        job.status,
        extra={"job_id": job.id, "attempt_id": attempt.id},
    )
    return AgentEnd(job.id, job.status, terminate, relaunch=job.status in _WAITING)


def preemption_notice(
    session: Session,
    attempt_id: str,
    token: str,
    reason: str,
    now: datetime,
    *,
    node: int = 0,
) -> AgentEnd:
    """The agent got the cloud's preemption notice, stopped the program and saved what it
    could: the attempt ends now (billing stops) through ``lifecycle.preempted``. A notice
    from any node of a gang ends the whole gang (it cannot go on without the node)."""
    attempt, job = _node_call(session, attempt_id, token, node, now)
    session.commit()
    if node != 0:
        reason = f"node {node}: {reason}" if reason else f"node {node}"
    terminate = lifecycle.preempted(session, attempt.id, now, reason or None)
    _learn_speed(session, attempt.id)
    session.refresh(job)
    log.info(
        "preemption notice: %s",
        reason,
        extra={"job_id": job.id, "attempt_id": attempt.id, "zone": attempt.zone},
    )
    return AgentEnd(job.id, job.status, terminate, relaunch=job.status in _WAITING)


def lease_lapsed(
    session: Session,
    attempt_id: str,
    token: str,
    now: datetime,
    *,
    node: int = 0,
    settings: Settings | None = None,
) -> AgentEnd:
    """The agent stopped its program at the end of its spend lease (no progress ack renewed
    it in time): the attempt ends now through ``lifecycle.lease_lapsed``, so an overrun
    lasts until the agent's report, not until the lease sweep comes round. From any node of
    a gang, the whole gang ends."""
    settings = settings or get_settings()
    attempt, job = _node_call(session, attempt_id, token, node, now)
    session.commit()
    lookahead = lookahead_seconds(settings.tick_seconds * clock.scale())
    terminate = lifecycle.lease_lapsed(session, attempt.id, now, lookahead)
    session.refresh(job)
    log.warning(
        "node %s's agent stopped at its spend lease's end: job %s",
        node,
        job.status,
        extra={"job_id": job.id, "attempt_id": attempt.id, "team_id": job.team_id},
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
