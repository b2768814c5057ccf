"""The FastAPI application: routers, error mapping, body size and time limits."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import SQLAlchemyError

from broker.api import ui
from broker.api.errors import install_error_handlers
from broker.api.limits import BodyLimits
from broker.api.routes import (
    agent,
    attempts,
    budget,
    health,
    jobs,
    metrics,
    prices,
    quotes,
    teams,
    workdirs,
)
from broker.api.ui_security import DashboardHeaders
from broker.db.engine import open_session
from broker.services import dispatch, quoting
from broker.settings import get_settings

log = logging.getLogger(__name__)


def _warm_up() -> None:
    try:
        with open_session() as session:
            quoting.warm_up(session)
    except SQLAlchemyError as error:  # the database may come up later; requests will sync
        log.warning("planning not warmed up: %s", error)


@asynccontextmanager
async def _serving(_app: FastAPI) -> AsyncIterator[None]:
    """Startup: the planning built before the first request."""
    await run_in_threadpool(_warm_up)
    # Sync routes and dependencies share this pool; anyio's default of 40 threads only adds
    # GIL and lock contention on a pool whose work is CPU-bound Python.
    to_thread.current_default_thread_limiter().total_tokens = get_settings().api_threads
    yield
    await run_in_threadpool(dispatch.flush_launches, 5.0)  # the last window's launches


def create_app() -> FastAPI:
    """A new app wired to the configured database and clock."""
    app = FastAPI(
        title="GPU broker",
        version="1",
        description="Deadline- and budget-aware GPU job broker (see API.md).",
        lifespan=_serving,
    )
    for module in (teams, jobs, quotes, prices, budget, attempts, agent, workdirs, health, metrics):
        app.include_router(module.router)
    app.include_router(ui.router)
    app.mount(f"{ui.BASE}/static", ui.static, name="ui-static")
    install_error_handlers(app)
    app.add_middleware(DashboardHeaders, base=ui.BASE, static=f"{ui.BASE}/static")
    settings = get_settings()
    app.add_middleware(
        BodyLimits,
        max_bytes=settings.max_body_bytes,
        timeout_seconds=settings.body_timeout_seconds,
        path_limits={
            attempts.LOGS_PATH: attempts.LOG_BODY_BYTES,
            workdirs.PATH: settings.workdir_limit_bytes,
        },
    )
    return app


app = create_app()
