"""The agent's own code, served to the instance that boots it: ``broker/agent/agent.py`` and
the SDK its program imports, ``broker/agent/broker_sdk.py``. Only for a live attempt's token
(the boot script has it), like every agent route."""

from __future__ import annotations

from importlib.resources import files
from typing import Annotated

from fastapi import APIRouter, Query, Response

from broker.api.deps import NowDep, SessionDep, SessionRoute
from broker.api.errors import error_responses
from broker.api.routes.attempts import TokenDep
from broker.api.schemas import ID_PATTERN
from broker.services import agent_reports

router = APIRouter(prefix="/v1/agent", tags=["agent"], route_class=SessionRoute)

PYTHON = "text/x-python"
AttemptQuery = Annotated[str, Query(min_length=1, max_length=64, pattern=ID_PATTERN)]
SERVED = {
    200: {"content": {PYTHON: {"schema": {"type": "string"}}}, "description": "Python source"},
    **error_responses(401, 404, 409),
}


def _source(name: str) -> Response:
    # Read per call: a package resource, small, and a new deploy must serve its new code.
    text = files("broker.agent").joinpath(name).read_text(encoding="utf-8")
    return Response(content=text, media_type=PYTHON)


@router.get("", response_class=Response, responses=SERVED)
def get_agent(attempt: AttemptQuery, session: SessionDep, now: NowDep, token: TokenDep) -> Response:
    """The agent (one file, Python standard library only) for attempt ``attempt``."""
    agent_reports.heard(session, attempt, token, now)
    return _source("agent.py")


@router.get("/sdk", response_class=Response, responses=SERVED)
def get_sdk(attempt: AttemptQuery, session: SessionDep, now: NowDep, token: TokenDep) -> Response:
    """``broker_sdk``, the module a training program reports progress and checkpoints with."""
    agent_reports.heard(session, attempt, token, now)
    return _source("broker_sdk.py")
