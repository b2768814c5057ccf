"""Shared fixtures: a real database (SQLite, or PostgreSQL when BROKER_TEST_DATABASE_URL is
set), the app on it, a manual clock, and helpers to make teams and keys."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from tests.helpers import drop_postgres, fresh_postgres, moto_s3, moto_store

ADMIN_TOKEN = "adm_test_" + secrets.token_hex(8)
START = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, empty database for this test session, dropped afterwards."""
    base = os.environ.get("BROKER_TEST_DATABASE_URL")
    if base:
        url, name = fresh_postgres(base)
        yield url
        drop_postgres(base, name)
        return
    with tempfile.TemporaryDirectory(prefix="broker-test-") as folder:
        yield f"sqlite:///{Path(folder) / 'broker.db'}"


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="broker-data-") as folder:
        yield Path(folder)


@pytest.fixture(scope="session")
def engine(database_url: str, data_dir: Path) -> Iterator[Engine]:
    """The broker's engine on the test database, migrated to head."""
    from broker import settings
    from broker.db import engine as db

    os.environ["BROKER_DATABASE_URL"] = database_url
    os.environ["BROKER_ADMIN_TOKEN"] = ADMIN_TOKEN
    os.environ["BROKER_DATA_DIR"] = str(data_dir)
    settings.get_settings.cache_clear()
    db.get_engine.cache_clear()
    engine = db.get_engine()
    db.create_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def db_engine(engine: Engine) -> Iterator[Engine]:
    """The engine, with every table emptied after the test (and the process's planning's
    copies of the learnt corrections and the spot model's histories dropped with them)."""
    from broker.services import quoting

    yield engine
    with engine.begin() as connection:
        for table in reversed(SQLModel.metadata.sorted_tables):
            connection.execute(table.delete())
    if quoting.get_planning.cache_info().currsize:
        quoting.get_planning().forget_learnt()
        quoting.get_planning().forget_spot_histories()


@pytest.fixture
def clock() -> Iterator[object]:
    """A manual broker clock at START for the test."""
    from broker.clock import ManualClock, set_clock

    manual = ManualClock(START)
    set_clock(manual)
    yield manual
    set_clock(None)


@pytest.fixture
def app(db_engine: Engine, clock: object):  # type: ignore[no-untyped-def]
    from broker.api import create_app

    return create_app()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server for the whole run (keys are per job and team: tests do not meet)."""
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def store(s3_endpoint: str, app):  # type: ignore[no-untyped-def]
    """The broker's bucket on the moto server: the store the app's routes use."""
    from broker.services import agent_channel

    store = moto_store(s3_endpoint)
    app.dependency_overrides[agent_channel.get_store] = lambda: store
    return store


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def make_team(client, admin_headers):  # type: ignore[no-untyped-def]
    """Create a team with a budget and a key; returns (team json, headers with its key)."""

    def _make(
        name: str | None = None,
        limit: str = "1000.00",
        period: str = "month",
        alert_at: float = 0.8,
    ) -> tuple[dict, dict[str, str]]:
        body = {
            "name": name or f"team-{secrets.token_hex(3)}",
            "budget": {"limit": limit, "period": period, "alert_at": alert_at},
        }
        team = client.post("/v1/teams", json=body, headers=admin_headers)
        assert team.status_code == 201, team.text
        key = client.post(
            f"/v1/teams/{team.json()['id']}/keys", json={"name": "ci"}, headers=admin_headers
        )
        assert key.status_code == 201, key.text
        return team.json(), {"Authorization": f"Bearer {key.json()['token']}"}

    return _make


@pytest.fixture
def live_server(app):  # type: ignore[no-untyped-def]
    """The app under a real uvicorn server on a free loopback port; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def fresh_planning(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process-wide planning checks the stored prices on every call, and is rebuilt
    afterwards so no other test plans on prices a test stored (price tests use it)."""
    from broker.services import quoting
    from broker.settings import get_settings

    monkeypatch.setenv("BROKER_PRICE_CHECK_SECONDS", "0")
    get_settings.cache_clear()
    quoting.get_planning.cache_clear()
    yield
    get_settings.cache_clear()
    quoting.get_planning.cache_clear()
