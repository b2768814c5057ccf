"""Team route: upload a workdir (a tar.gz of the code a job's program runs in)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, HTTPException, status
from pydantic import BaseModel, Field

from broker.api.deps import SessionRoute, TeamDep
from broker.api.errors import ErrorBody, ValidationErrorBody, error_responses
from broker.services import agent_channel, workdirs
from providers.base import ProviderError
from providers.storage import S3CheckpointStore

router = APIRouter(
    prefix="/v1", tags=["workdirs"], responses=error_responses(401, 403), route_class=SessionRoute
)

PATH = r"^/v1/workdirs/?$"
"""The route's path for the app's body limits (``BROKER_WORKDIR_LIMIT_BYTES`` here)."""
StoreDep = Annotated[S3CheckpointStore, Depends(agent_channel.get_store)]


class WorkdirOut(BaseModel):
    workdir: str = Field(
        description="s3://<bucket>/workdirs/<team_id>/<sha256>.tar.gz: a job's run.workdir"
    )
    bytes: int


@router.post(
    "/workdirs",
    status_code=status.HTTP_201_CREATED,
    response_model=WorkdirOut,
    responses={
        **error_responses(413),
        422: {"model": ValidationErrorBody, "description": "The body is not a valid tar.gz"},
        503: {"model": ErrorBody, "description": "The object store did not answer: send again"},
    },
)
def upload_workdir(
    team_id: TeamDep,
    store: StoreDep,
    archive: Annotated[bytes, Body(media_type="application/gzip")] = b"",
) -> WorkdirOut:
    """Store a gzip'd tar of a job's working folder (at most ``BROKER_WORKDIR_LIMIT_BYTES``,
    64 MiB; its members inside the folder, no devices); use the answer's ``workdir`` as a
    job spec's ``run.workdir``. The same archive is the same object."""
    try:
        stored = workdirs.store_workdir(store, team_id, archive)
    except ProviderError as error:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail={"code": "unavailable", "message": f"workdir not stored: {error}"},
        ) from error
    return WorkdirOut(workdir=stored.uri, bytes=stored.size)
