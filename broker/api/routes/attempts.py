"""Agent routes: a training instance's agent, with its per-attempt token, fetches its run spec,
reports progress, gets checkpoint upload URLs, sends its program's log and says how the
program ended. Refused everywhere: another attempt's token (404), an ended attempt (409), an
expired token (401)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Depends, Header, HTTPException, Query, status
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from broker.api.deps import NowDep, SessionDep, SessionRoute
from broker.api.errors import error_responses
from broker.api.schemas import ResourceId
from broker.services import agent_channel, dispatch
from broker.services.agent_channel import AgentEnd
from broker.services.job_spec import PRINTABLE
from providers.base import ProviderError
from providers.storage import S3CheckpointStore

router = APIRouter(prefix="/v1/attempts", tags=["agent"], route_class=SessionRoute)

LOGS_PATH = r"^/v1/attempts/[^/]+/logs$"
LOG_BODY_BYTES = 256 * 1024
"""A log chunk may be this large (the app's body limit for LOGS_PATH); other routes keep
``BROKER_MAX_BODY_BYTES``."""
REFUSALS = error_responses(401, 404, 409)
WITH_BODY = error_responses(401, 404, 409, 413)

StoreDep = Annotated[S3CheckpointStore, Depends(agent_channel.get_store)]


def attempt_token(
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> str:
    """The per-attempt bearer token the instance was launched with; 401 otherwise."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.startswith("att_"):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail={"code": "unauthorized", "message": "missing or invalid attempt token"},
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token


TokenDep = Annotated[str, Depends(attempt_token)]
MAX_NODES = 1024
NodeQuery = Annotated[
    int, Query(ge=0, lt=MAX_NODES, description="The gang node's rank (0 for a single node).")
]
NODE_FIELD = Field(default=0, ge=0, lt=MAX_NODES, description="The gang node's rank.")


class ProgressIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    work_done: float = Field(ge=0, le=1e15)
    checkpoint_key: str | None = Field(
        default=None, min_length=1, max_length=500, pattern=PRINTABLE
    )
    node: int = Field(
        default=0,
        ge=0,
        lt=MAX_NODES,
        description="The gang node's rank: a node >= 1 only heartbeats (its work is ignored).",
    )


class ProgressAck(BaseModel):
    job_status: str
    work_done: float
    total_work: float
    should_stop: bool
    lease_seconds_left: float


class GangOut(BaseModel):
    """A gang node's place: its rank, the node count and node 0's rendezvous (null until
    node 0 has reported it)."""

    model_config = ConfigDict(from_attributes=True)
    node_rank: int
    nodes: int
    master_addr: str | None
    master_port: int | None


class RunSpecOut(BaseModel):
    """What the agent runs and how (see the protocol in docs/api.md, "Agent routes");
    ``gang`` only for a multi-node attempt."""

    model_config = ConfigDict(from_attributes=True)
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
    gang: GangOut | None = None

    @model_serializer(mode="wrap")
    def _single_node_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("gang") is None:
            data.pop("gang", None)  # a single-node attempt's spec is what it always was
        return data


class CheckpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    work_done: float = Field(ge=0, le=1e15)
    node: int = NODE_FIELD


class RendezvousIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: int = Field(default=0, ge=0, lt=MAX_NODES, description="Must be 0: node 0 reports.")
    addr: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.:_%-]*$",
        description="The host name or IP address node 0's program listens on.",
    )
    port: int = Field(ge=1, le=65535)


class UploadOut(BaseModel):
    key: str
    url: str


class LogAck(BaseModel):
    accepted_bytes: int
    truncated: bool


class ExitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exit_code: int = Field(
        ge=-255, le=255, description="The exit status, or minus the signal that killed it."
    )
    tail: str = Field(default="", max_length=4096, description="The output's last lines.")
    node: int = NODE_FIELD


class PreemptedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")
    node: int = NODE_FIELD


class LapsedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: int = NODE_FIELD


class JobStatusOut(BaseModel):
    job_status: str


@router.get("/{attempt_id}/run", response_model=RunSpecOut, responses=REFUSALS)
def get_run_spec(
    attempt_id: ResourceId,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    store: StoreDep,
    node: NodeQuery = 0,
) -> RunSpecOut:
    """The attempt's run spec: the program, its environment, where its workdir and the
    checkpoint to restore are (presigned URLs), and the agent's timings; for a gang, node
    ``node``'s rank and the rendezvous (``gang``; 422 naming ``node`` for another rank)."""
    spec = agent_channel.run_spec(session, store, attempt_id, token, now, node=node)
    return RunSpecOut.model_validate(spec)


@router.post("/{attempt_id}/rendezvous", response_model=GangOut, responses=WITH_BODY)
def report_rendezvous(
    attempt_id: ResourceId, body: RendezvousIn, session: SessionDep, now: NowDep, token: TokenDep
) -> GangOut:
    """Node 0 of a gang says where its program's rendezvous listens (``addr``:``port``), before
    it starts the program; the other nodes' run specs then carry it. From any other node, or
    for a single-node attempt: 422 naming ``node``."""
    gang = agent_channel.rendezvous(
        session, attempt_id, token, body.node, body.addr, body.port, now
    )
    return GangOut.model_validate(gang)


@router.post("/{attempt_id}/progress", response_model=ProgressAck, responses=WITH_BODY)
def report_progress(
    attempt_id: ResourceId, body: ProgressIn, session: SessionDep, now: NowDep, token: TokenDep
) -> ProgressAck:
    """Report the attempt's work done and, with ``checkpoint_key``, a checkpoint saved under
    the job's ``jobs/{job_id}/`` prefix; also the agent's heartbeat. Work beyond what the
    attempt's GPUs can have done by now is refused (422); reported work alone never
    finishes the job. A gang's node >= 1 only heartbeats (its work is ignored, a checkpoint
    key from it is a 422)."""
    ack = agent_channel.acknowledge_progress(
        session, attempt_id, token, body.work_done, body.checkpoint_key, now, node=body.node
    )
    return ProgressAck.model_validate(ack, from_attributes=True)


@router.post("/{attempt_id}/checkpoints", response_model=UploadOut, responses=WITH_BODY)
def checkpoint_upload(
    attempt_id: ResourceId,
    body: CheckpointIn,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    store: StoreDep,
) -> UploadOut:
    """A key for the next checkpoint (under ``jobs/{job_id}/checkpoints/{attempt_id}/``) and
    a presigned PUT URL for one tar.gz; report it with ``progress`` after the upload. Node 0
    only (another node: 422 naming ``node``)."""
    upload = agent_channel.checkpoint_upload(
        session, store, attempt_id, token, body.work_done, now, node=body.node
    )
    return UploadOut(key=upload.key, url=upload.url)


@router.post(
    "/{attempt_id}/logs",
    response_model=LogAck,
    responses={**WITH_BODY, 503: {"description": "The log store did not answer: send again"}},
)
def post_logs(
    attempt_id: ResourceId,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    store: StoreDep,
    chunk: Annotated[bytes, Body(media_type="text/plain")] = b"",
    node: NodeQuery = 0,
) -> LogAck:
    """Append a chunk of node ``node``'s program output (UTF-8 text, at most 256 KiB; a byte
    that is not UTF-8 is kept as U+FFFD). Past the attempt's log limit (a gang's: times its
    nodes, shared) the broker keeps one truncation line and drops the rest."""
    text = chunk.decode("utf-8", "replace")
    try:
        ack = agent_channel.store_log(session, store, attempt_id, token, text, now, node=node)
    except ProviderError as error:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail={"code": "unavailable", "message": f"log not stored: {error}"},
        ) from error
    return LogAck(accepted_bytes=ack.accepted_bytes, truncated=ack.truncated)


def _carry_out(end: AgentEnd, background: BackgroundTasks) -> JobStatusOut:
    background.add_task(dispatch.enqueue_terminate, end.terminate)
    if end.relaunch:
        background.add_task(dispatch.enqueue_launch, end.job_id)
    return JobStatusOut(job_status=end.job_status)


@router.post("/{attempt_id}/exit", response_model=JobStatusOut, responses=WITH_BODY)
def program_exited(
    attempt_id: ResourceId,
    body: ExitIn,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    background: BackgroundTasks,
) -> JobStatusOut:
    """The program exited: 0 finishes the job; another code relaunches it from its latest
    checkpoint while ``max_restarts_on_errors`` allows, else fails it with the code and the
    tail's last lines. A gang's node >= 1: a non-zero code does the same, 0 is only logged."""
    end = agent_channel.program_exited(
        session, attempt_id, token, body.exit_code, body.tail, now, node=body.node
    )
    return _carry_out(end, background)


@router.post("/{attempt_id}/preempted", response_model=JobStatusOut, responses=WITH_BODY)
def preemption_notice(
    attempt_id: ResourceId,
    body: PreemptedIn,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    background: BackgroundTasks,
) -> JobStatusOut:
    """The cloud gave notice and the agent saved what it could: the attempt ends now, its
    instance is terminated and the job's next attempt launched. From any node of a gang,
    the whole gang ends."""
    end = agent_channel.preemption_notice(
        session, attempt_id, token, body.reason, now, node=body.node
    )
    return _carry_out(end, background)


@router.post("/{attempt_id}/lapsed", response_model=JobStatusOut, responses=WITH_BODY)
def lease_lapsed(
    attempt_id: ResourceId,
    body: LapsedIn,
    session: SessionDep,
    now: NowDep,
    token: TokenDep,
    background: BackgroundTasks,
) -> JobStatusOut:
    """The agent stopped the program because its spend lease ended unrenewed: the attempt
    ends now (end reason ``lease``; time past the lease booked as an overrun), its instance
    is terminated, and the job relaunches from its latest checkpoint, stops as
    ``budget_exhausted``, or succeeds when its checkpoints hold all its work. From any node
    of a gang, the whole gang ends."""
    end = agent_channel.lease_lapsed(session, attempt_id, token, now, node=body.node)
    return _carry_out(end, background)
