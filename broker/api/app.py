"""The FastAPI application: routers, error mapping, body size limit."""

from __future__ import annotations

from fastapi import FastAPI

from broker.api import ui
from broker.api.errors import install_error_handlers
from broker.api.limits import BodySizeLimit
from broker.api.routes import attempts, budget, health, jobs, metrics, quotes, teams
from broker.settings import get_settings


def create_app() -> FastAPI:
    """A new app wired to the configured database and clock."""
    app = FastAPI(
        title="GPU broker",
        version="1",
        description="Deadline- and budget-aware GPU job broker (see API.md).",
    )
    for module in (teams, jobs, quotes, budget, attempts, health, metrics):
        app.include_router(module.router)
    app.include_router(ui.router)
    app.mount(f"{ui.BASE}/static", ui.static, name="ui-static")
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=get_settings().max_body_bytes)
    return app


app = create_app()
