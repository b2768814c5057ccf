"""Agent route: a training instance reports progress with its per-attempt token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from broker.api.deps import NowDep, SessionDep
from broker.api.errors import error_responses
from broker.api.schemas import ResourceId
from broker.services import agent_reports
from broker.services.job_spec import PRINTABLE

router = APIRouter(prefix="/v1/attempts", tags=["agent"])


class ProgressIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    work_done: float = Field(ge=0, le=1e15)
    checkpoint_key: str | None = Field(
        default=None, min_length=1, max_length=500, pattern=PRINTABLE
    )


class ProgressAck(BaseModel):
    job_status: str
    work_done: float
    total_work: float


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


@router.post(
    "/{attempt_id}/progress",
    response_model=ProgressAck,
    responses=error_responses(401, 404, 409, 413),
)
def report_progress(
    attempt_id: ResourceId,
    body: ProgressIn,
    session: SessionDep,
    now: NowDep,
    token: Annotated[str, Depends(attempt_token)],
) -> ProgressAck:
    """Report the attempt's work done and, with ``checkpoint_key``, a checkpoint saved under
    the job's ``jobs/{job_id}/`` prefix. Work beyond what the attempt's GPUs can have done
    by now is refused (422); only a checkpoint holding all the work finishes the job."""
    job = agent_reports.report_progress(
        session, attempt_id, token, body.work_done, body.checkpoint_key, now
    )
    return ProgressAck(job_status=job.status, work_done=job.work_done, total_work=job.total_work)
