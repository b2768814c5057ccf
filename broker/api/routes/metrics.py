"""``GET /metrics``: Prometheus text format, unauthenticated, aggregate numbers only.

The router also brings the API's logging up at startup (``broker.logs``), so that the app
module wires observability with one include.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from broker.api.deps import NowDep, SessionDep
from broker.logs import configure_logging
from broker.services.metrics import render
from broker.settings import get_settings


@asynccontextmanager
async def _logging(_app: FastAPI) -> AsyncIterator[None]:
    configure_logging(get_settings())
    yield


router = APIRouter(tags=["ops"], lifespan=_logging)


@router.get("/metrics", response_class=Response)
def metrics(session: SessionDep, now: NowDep) -> Response:
    """Worker metrics of every process on this host, and figures counted from the database."""
    body = render(session, now, get_settings().resolved_metrics_dir)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
