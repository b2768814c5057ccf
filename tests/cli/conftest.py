"""Fixtures of the client command tests: the ``broker`` CLI on a real uvicorn server."""

from __future__ import annotations

import pytest

from broker.settings import get_settings
from tests.cli.support import runner


@pytest.fixture
def broker_cli(live_server, monkeypatch):
    """``run(*args, token=...)``: the ``broker`` CLI on the live server with that token."""
    from broker.cli import app

    monkeypatch.setenv("BROKER_API_URL", live_server)

    def run(*args: str, token: str | None):  # type: ignore[no-untyped-def]
        if token is None:
            monkeypatch.delenv("BROKER_API_TOKEN", raising=False)
        else:
            monkeypatch.setenv("BROKER_API_TOKEN", token)
        get_settings.cache_clear()
        return runner.invoke(app, list(args))

    yield run
    get_settings.cache_clear()


@pytest.fixture
def admin_token(admin_headers) -> str:
    return admin_headers["Authorization"].removeprefix("Bearer ")


@pytest.fixture
def team_key(make_team) -> tuple[dict, str]:
    team, headers = make_team(limit="1000.00")
    return team, headers["Authorization"].removeprefix("Bearer ")
