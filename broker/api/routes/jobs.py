"""Team routes: submit, list, show and cancel jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Header, Query, Response, status

from broker.api.deps import NowDep, SessionDep, TeamDep
from broker.api.errors import INFEASIBLE_OR_INVALID, error_responses
from broker.api.present import job_out, job_summary
from broker.api.schemas import ID_PATTERN, JobOut, JobPage, ResourceId
from broker.core.job_status import JobStatus
from broker.services import admission, dispatch, ledger, lifecycle
from broker.services import job_views as queries
from broker.services.job_spec import PRINTABLE, JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 403))

IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200, pattern=PRINTABLE)
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses={**error_responses(402, 409, 413), **INFEASIBLE_OR_INVALID},
)
def submit_job(
    spec: JobSpec,
    response: Response,
    session: SessionDep,
    now: NowDep,
    team_id: TeamDep,
    background: BackgroundTasks,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    job, created = admission.submit(session, team_id, spec, now, idempotency_key)
    if created:
        background.add_task(dispatch.enqueue_launch, job.id)
    else:
        response.status_code = status.HTTP_200_OK
        return job_out(queries.job_view(session, team_id, job.id))
    return job_out(queries.new_job_view(job, reserved=ledger.job_reserved(session, job.id)))


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
