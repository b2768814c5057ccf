"""Team routes: submit, list, show and cancel jobs, and read their programs' logs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import (
    APIRouter,
    BackgroundTasks,
    Depends,
    Header,
    HTTPException,
    Query,
    Response,
    status,
)
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from broker.api.deps import NowDep, SessionDep, SessionRoute, TeamDep
from broker.api.errors import INFEASIBLE_OR_INVALID, ErrorBody, error_responses
from broker.api.present import job_out, job_summary
from broker.api.schemas import ID_PATTERN, JobOut, JobPage, ResourceId
from broker.core.job_status import JobStatus
from broker.services import admission, agent_channel, dispatch, job_logs, lifecycle
from broker.services import job_views as queries
from broker.services.job_spec import PRINTABLE, JobSubmission
from broker.settings import get_settings
from providers.base import ProviderError
from providers.storage import S3CheckpointStore

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 403), route_class=SessionRoute
)

IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200, pattern=PRINTABLE)
]
StoreDep = Annotated[S3CheckpointStore, Depends(agent_channel.get_store)]
TEXT = "text/plain; charset=utf-8"
STORE_DOWN: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "The log store did not answer: ask again"}
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses={**error_responses(402, 409, 413), **INFEASIBLE_OR_INVALID},
)
async def submit_job(
    spec: JobSubmission,
    response: Response,
    session: SessionDep,
    now: NowDep,
    team_id: TeamDep,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    # Async, with its database work in one thread-pool call: a sync route costs one more
    # thread hop to validate its response (FastAPI's serialize_response).
    def admit() -> tuple[JobOut, bool]:
        admitted = admission.admit(session, team_id, spec, now, idempotency_key)
        if not admitted.created:
            return job_out(queries.job_view(session, team_id, admitted.job.id)), False
        # Handed to the launch publisher's thread (batched, off the request path) from here:
        # a background task would cost the event loop one more thread hop per job.
        dispatch.enqueue_launch(admitted.job.id)
        return job_out(queries.new_job_view(admitted.job, reserved=admitted.reserved)), True

    out, created = await run_in_threadpool(admit)
    if not created:
        response.status_code = status.HTTP_200_OK
    return out


@router.get("", response_model=JobPage)
def list_jobs(
    session: SessionDep,
    team_id: TeamDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=64, pattern=ID_PATTERN)] = None,
) -> JobPage:
    jobs, next_cursor = queries.list_jobs(
        session, team_id, status_filter.value if status_filter else None, limit, cursor
    )
    return JobPage(items=[job_summary(j) for j in jobs], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobOut, responses=error_responses(404))
def get_job(job_id: ResourceId, session: SessionDep, team_id: TeamDep) -> JobOut:
    return job_out(queries.job_view(session, team_id, job_id))


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=error_responses(404, 409),
)
def cancel_job(
    job_id: ResourceId,
    session: SessionDep,
    now: NowDep,
    team_id: TeamDep,
    background: BackgroundTasks,
) -> JobOut:
    background.add_task(dispatch.enqueue_terminate, lifecycle.cancel(session, team_id, job_id, now))
    return job_out(queries.job_view(session, team_id, job_id))


def _unavailable(error: ProviderError) -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        detail={"code": "unavailable", "message": f"log not read: {error}"},
    )


@router.get(
    "/{job_id}/logs",
    response_class=Response,
    responses={
        200: {"content": {TEXT: {"schema": {"type": "string"}}}, "description": "The log"},
        **error_responses(404),
        **STORE_DOWN,
    },
)
def get_logs(
    job_id: ResourceId,
    session: SessionDep,
    team_id: TeamDep,
    store: StoreDep,
    attempt: Annotated[str | None, Query(min_length=1, max_length=64, pattern=ID_PATTERN)] = None,
    tail: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    follow: bool = False,
    node: Annotated[int, Query(ge=0, lt=1024)] = 0,
) -> Response:
    """The program's output: one ``attempt``'s, or every attempt's in order, each after a
    line ``==> attempt <id> (<zone>, <market>) <==``; ``tail``: each one's last lines.
    ``follow``: then stream new output until the job has finished (at most
    ``BROKER_LOG_FOLLOW_SECONDS``). ``node``: a gang node's output (0: node 0's, the
    single node's)."""
    if follow:
        job_logs.log_state(session, team_id, job_id, attempt, node)  # 404 before streaming
        lines = job_logs.follow_job_log(
            store,
            team_id,
            job_id,
            attempt,
            tail,
            node=node,
            max_seconds=get_settings().log_follow_seconds,
        )
        return StreamingResponse(lines, media_type=TEXT)
    try:
        text = job_logs.job_log(session, store, team_id, job_id, attempt, tail, node)
    except ProviderError as error:
        raise _unavailable(error) from error
    return PlainTextResponse(text, media_type=TEXT)
