"""Migrations keep data: upgrade from the first revision to head on a filled database, and
downgrade, on SQLite and (with BROKER_TEST_DATABASE_URL) on PostgreSQL."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from broker.db.engine import make_engine
from broker.db.migrate import downgrade, upgrade
from tests.helpers import SPOT_PLAN, drop_postgres, fresh_postgres


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


def test_upgrade_from_first_revision_keeps_data_and_downgrade_to_0002(empty_engine):
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
    downgrade(empty_engine, "0002")
    job_columns = {c["name"] for c in inspect(empty_engine).get_columns("job")}
    assert "on_demand_cost_micros" not in job_columns
    assert "price_snapshot" in set(inspect(empty_engine).get_table_names())
    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM team")).scalar() == 1
        assert connection.execute(text("SELECT count(*) FROM ledger_entry")).scalar() == 1


AT = datetime(2026, 12, 1, tzinfo=UTC)
TEAM = sa.table(
    "team",
    *(sa.column(name) for name in ("id", "name", "budget_limit_micros", "budget_period")),
    sa.column("alert_at"),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)
JOB = sa.table(
    "job",
    *(sa.column(name) for name in ("id", "team_id", "name", "status", "market", "priority")),
    *(sa.column(name) for name in ("total_work", "work_done", "checkpointed_work")),
    sa.column("max_cost_micros"),
    sa.column("spec", sa.JSON()),
    sa.column("plan", sa.JSON()),
    *(sa.column(name, sa.DateTime(timezone=True)) for name in ("deadline", "created_at")),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)
WHERE = SPOT_PLAN  # where the plan below runs
# A plan as revision 0003 stored it (the API's decimal strings), and as 0004 stores it.
STRING_PLAN = {
    **WHERE,
    "price_per_hour": "0.918",
    "expected_hours": 10.4321,
    "expected_cost": "9.576",
    "worst_case_cost": "31.824015",
    "p_deadline": 0.9988,
}
MICROS_PLAN = {
    **WHERE,
    "price_per_hour_micros": 918_000,
    "expected_hours": 10.4321,
    "expected_cost_micros": 9_576_000,
    "worst_case_cost_micros": 31_824_015,
    "p_deadline": 0.9988,
}


def _job(job_id: str, plan: dict | None) -> dict:
    return {
        "id": job_id,
        "team_id": "team_1",
        "name": job_id,
        "status": "queued",
        "market": "auto",
        "priority": 0,
        "total_work": 100.0,
        "work_done": 0.0,
        "checkpointed_work": 0.0,
        "max_cost_micros": 250_000_000,
        "spec": {"name": job_id},
        "plan": plan,
        "deadline": AT,
        "created_at": AT,
        "updated_at": AT,
    }


def _plans(engine: Engine) -> dict[str, object]:
    with engine.connect() as connection:
        return dict(connection.execute(sa.select(JOB.c.id, JOB.c.plan)).all())


def test_0004_stores_plan_money_as_micros_and_its_downgrade_restores_the_strings(empty_engine):
    upgrade(empty_engine, "0003")
    with empty_engine.begin() as connection:
        connection.execute(
            TEAM.insert().values(
                id="team_1",
                name="kept",
                budget_limit_micros=5_000_000,
                budget_period="month",
                alert_at=0.8,
                created_at=AT,
                updated_at=AT,
            )
        )
        connection.execute(JOB.insert(), [_job("job_1", STRING_PLAN), _job("job_2", None)])
    upgrade(empty_engine, "0004")
    plans = _plans(empty_engine)
    assert plans["job_1"] == MICROS_PLAN
    assert list(plans["job_1"]) == list(MICROS_PLAN)  # type: ignore[call-overload]
    assert plans["job_2"] is None
    # A plan written after the upgrade keeps full precision; the string form rounded it.
    new_plan = {**MICROS_PLAN, "expected_hours": 3.123456789, "worst_case_cost_micros": 10**7}
    with empty_engine.begin() as connection:
        connection.execute(JOB.insert(), [_job("job_3", new_plan)])
    downgrade(empty_engine, "0003")
    plans = _plans(empty_engine)
    assert plans["job_1"] == STRING_PLAN
    assert list(plans["job_1"]) == list(STRING_PLAN)  # type: ignore[call-overload]
    assert plans["job_2"] is None
    assert plans["job_3"] == {**STRING_PLAN, "expected_hours": 3.1235, "worst_case_cost": "10.00"}


ATTEMPT = sa.table(
    "attempt",
    *(sa.column(name) for name in ("id", "job_id", "team_id", "provider", "region", "zone")),
    *(sa.column(name) for name in ("instance_type", "gpu", "gpu_count", "market", "status")),
    *(sa.column(name) for name in ("price_micros_per_hour", "token_hash", "work_at_start")),
    *(sa.column(name) for name in ("work_done", "billed_seconds", "cost_micros")),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
AGENT_COLUMNS = {"last_heard_at", "exit_code", "log_bytes", "log_chunks"}


def test_0006_gives_existing_attempts_an_unheard_agent_and_an_empty_log(empty_engine):
    upgrade(empty_engine, "0005")
    with empty_engine.begin() as connection:
        connection.execute(
            TEAM.insert().values(
                id="team_1",
                name="kept",
                budget_limit_micros=5_000_000,
                budget_period="month",
                alert_at=0.8,
                created_at=AT,
                updated_at=AT,
            )
        )
        connection.execute(JOB.insert(), [_job("job_1", MICROS_PLAN)])
        connection.execute(
            ATTEMPT.insert().values(
                id="att_1",
                job_id="job_1",
                team_id="team_1",
                **{k: WHERE[k] for k in ("provider", "region", "zone", "instance_type", "gpu")},
                gpu_count=1,
                market="spot",
                status="running",
                price_micros_per_hour=918_000,
                token_hash="0" * 64,
                work_at_start=0.0,
                work_done=10.0,
                billed_seconds=60.0,
                cost_micros=15_300,
                created_at=AT,
            )
        )
    upgrade(empty_engine, "0006")
    with empty_engine.connect() as connection:
        row = connection.execute(
            text("SELECT last_heard_at, exit_code, log_bytes, log_chunks FROM attempt")
        ).one()
    assert tuple(row) == (None, None, 0, 0)
    downgrade(empty_engine, "0005")
    columns = {c["name"] for c in inspect(empty_engine).get_columns("attempt")}
    assert not AGENT_COLUMNS & columns
    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT work_done FROM attempt")).scalar() == 10.0
