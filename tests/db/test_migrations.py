"""Migrations keep data: upgrade from the first revision to head on a filled database, and
downgrade one step, on SQLite and (with BROKER_TEST_DATABASE_URL) on PostgreSQL."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from broker.db.engine import make_engine
from broker.db.migrate import downgrade, upgrade
from tests.helpers import drop_postgres, fresh_postgres


@pytest.fixture
def empty_engine() -> Iterator[Engine]:
    base = os.environ.get("BROKER_TEST_DATABASE_URL")
    if base:
        url, name = fresh_postgres(base)
        engine = make_engine(url)
        yield engine
        engine.dispose()
        drop_postgres(base, name)
        return
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'm.db'}")
        yield engine
        engine.dispose()


def test_upgrade_from_first_revision_keeps_data_and_downgrade_one_step(empty_engine):
    upgrade(empty_engine, "0001")
    with empty_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO team (id, name, budget_limit_micros, budget_period, alert_at,"
                " created_at, updated_at) VALUES ('team_1', 'kept', 5000000, 'month', 0.8,"
                " '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
            )
        )
        connection.execute(
            text(
                "INSERT INTO ledger_entry (team_id, kind, amount_micros, created_at) VALUES"
                " ('team_1', 'reserve', 1000000, '2026-12-01 00:00:00')"
            )
        )
    upgrade(empty_engine, "head")
    tables = set(inspect(empty_engine).get_table_names())
    assert {"throughput_correction", "price_snapshot"} <= tables
    job_columns = {c["name"] for c in inspect(empty_engine).get_columns("job")}
    assert "on_demand_cost_micros" in job_columns
    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT name FROM team")).scalars().all() == ["kept"]
        assert (
            connection.execute(text("SELECT amount_micros FROM ledger_entry")).scalar() == 1000000
        )
    downgrade(empty_engine, "-1")
    job_columns = {c["name"] for c in inspect(empty_engine).get_columns("job")}
    assert "on_demand_cost_micros" not in job_columns
    assert "price_snapshot" in set(inspect(empty_engine).get_table_names())
    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM team")).scalar() == 1
        assert connection.execute(text("SELECT count(*) FROM ledger_entry")).scalar() == 1
