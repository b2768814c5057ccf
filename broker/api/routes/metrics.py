"""``GET /metrics``: Prometheus text format. Without credentials (or with a team key) only
aggregate numbers that name no team; with the admin token or ``BROKER_METRICS_TOKEN`` also
each team's money.

The router also brings the API's logging up at startup (``broker.logs``), so that the app
module wires observability with one include.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, HTTPException, Response, status
from prometheus_client import CONTENT_TYPE_LATEST

from broker.api.deps import NowDep, SessionDep, SessionRoute
from broker.logs import configure_logging
from broker.services.metrics import render
from broker.services.teams import authenticate
from broker.settings import get_settings


@asynccontextmanager
async def _logging(_app: FastAPI) -> AsyncIterator[None]:
    configure_logging(get_settings())
    yield


router = APIRouter(tags=["ops"], lifespan=_logging, route_class=SessionRoute)


def may_see_teams(session: SessionDep, authorization: str | None) -> bool:
    """True for the admin or metrics token; False without credentials or with a team key (one
    team may not see the others' money); 401 for any other token."""
    if authorization is None:
        return False
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        settings = get_settings()
        secrets = (settings.admin_token, settings.metrics_token)
        allowed = [secret.get_secret_value() for secret in secrets if secret is not None]
        if any(hmac.compare_digest(token.encode(), a.encode()) for a in allowed):
            return True
        if authenticate(session, token, None) is not None:
            return False
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail={"code": "unauthorized", "message": "/metrics takes the admin or metrics token"},
        headers={"WWW-Authenticate": "Bearer"},
    )


@router.get("/metrics", response_class=Response)
def metrics(
    session: SessionDep,
    now: NowDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Worker metrics of every process on this host, and figures counted from the database."""
    teams = may_see_teams(session, authorization)
    body = render(session, now, get_settings().resolved_metrics_dir, teams=teams)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
