"""The FastAPI application: routers, error mapping, body size and time limits."""

from __future__ import annotations

from fastapi import FastAPI

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
from broker.settings import get_settings


def create_app() -> FastAPI:
    """A new app wired to the configured database and clock."""
    app = FastAPI(
        title="GPU broker",
        version="1",
        description="Deadline- and budget-aware GPU job broker (see API.md).",
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
