"""500 concurrent submissions from several processes at the edge of one team's budget, on
PostgreSQL, against a real uvicorn server with two workers: the accepted reservations add up
to at most the budget, exactly; nothing is overspent.

Why it holds: ``admission.admit`` inserts the job, then locks the team row
(``ledger.lock_and_reserve``: SELECT ... FOR NO KEY UPDATE on PostgreSQL) and, in that same
transaction, with a statement that starts once the lock is granted, writes the reserve entry
only if it fits the team's limit less its outstanding reservations and spend, and commits.
Every submission for a team therefore checks its budget after the previous one's reservation
has committed (or rolled back), whichever uvicorn worker, process or connection it came
through; without the lock two transactions could both see the same "available" and both
reserve it.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.core.money import to_micros
from broker.db.models import Job, LedgerEntry, Team
from broker.devstack.processes import free_port, wait_until_healthy
from broker.services.ledger import team_budget
from tests.helpers import job_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(
        not os.environ.get("BROKER_TEST_DATABASE_URL"),
        reason="needs PostgreSQL: set BROKER_TEST_DATABASE_URL "
        "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)",
    ),
]

PROCESSES = 4
PER_PROCESS = 125
# Per client process: 32 requests in flight at once, enough to race (without the row lock a
# run overspends) while the two uvicorn workers stay well under PostgreSQL's 100 connections,
# which other test sessions may share.
THREADS = 8
ACCEPTED = 100  # the budget fits exactly this many reservations, plus a fraction of one
ADMIN_TOKEN = "adm_load_" + secrets.token_hex(8)


@pytest.fixture
def uvicorn_server(db_engine, database_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``broker.api:app`` under uvicorn with 2 worker processes on the (migrated) test
    database; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "BROKER_DATABASE_URL": database_url,
        "BROKER_ADMIN_TOKEN": ADMIN_TOKEN,
        "BROKER_DATA_DIR": str(tmp_path / "data"),
        "BROKER_LOG_LEVEL": "WARNING",
    }
    env.pop("BROKER_CLOCK_SCALE", None)
    env.pop("BROKER_CLOCK_EPOCH", None)
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "broker.api:app", "--host", "127.0.0.1"]
            + ["--port", str(port), "--workers", "2", "--log-level", "warning"],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, {"uvicorn": server}, lambda _name: log.read_text())
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _client_process(base_url: str, headers: dict, spec: dict, index: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    """One client process: PER_PROCESS submissions from THREADS threads, started together
    with the other processes; puts [(status, body)] on ``results``."""

    def submit(i: int) -> tuple[int, dict | str]:
        try:
            response = http.post("/v1/jobs", json={**spec, "name": f"load-{index}-{i}"})
        except httpx.HTTPError as error:
            return -1, repr(error)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    limits = httpx.Limits(max_connections=THREADS, max_keepalive_connections=THREADS)
    with httpx.Client(base_url=base_url, headers=headers, timeout=60, limits=limits) as http:
        barrier.wait(timeout=60)
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            outcome = list(pool.map(submit, range(PER_PROCESS)))
    results.put((index, outcome))


def test_500_concurrent_submissions_from_4_processes_never_overspend(
    uvicorn_server: str, db_engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server_log = tmp_path / "uvicorn.log"
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=uvicorn_server, timeout=30) as http:
        created = http.post(
            "/v1/teams",
            headers=admin,
            json={"name": "load", "budget": {"limit": "100000.00", "period": "total"}},
        )
        assert created.status_code == 201, created.text
        team_id = created.json()["id"]
        key = http.post(f"/v1/teams/{team_id}/keys", headers=admin, json={"name": "load"})
        assert key.status_code == 201, key.text
        headers = {"Authorization": f"Bearer {key.json()['token']}"}

        deadline = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
        spec = job_spec(
            max_cost="10.00",
            workload={"model": "ResNet-50", "steps": 4000},
            deadline=deadline.isoformat().replace("+00:00", "Z"),
        )
        # What a submission reserves (admission.reservation): one submitted by another team.
        probe = http.post(
            "/v1/teams",
            headers=admin,
            json={"name": "load-probe", "budget": {"limit": "100000.00", "period": "total"}},
        )
        assert probe.status_code == 201, probe.text
        probe_key = http.post(
            f"/v1/teams/{probe.json()['id']}/keys", headers=admin, json={"name": "probe"}
        )
        assert probe_key.status_code == 201, probe_key.text
        probe_headers = {"Authorization": f"Bearer {probe_key.json()['token']}"}
        probed = http.post("/v1/jobs", json=spec, headers=probe_headers)
        assert probed.status_code == 201, probed.text
        each = Decimal(probed.json()["reserved"])
        assert each > 0
        # N reservations plus 40% of one more: the (N+1)th never fits.
        limit = (each * ACCEPTED + each * Decimal("0.4")).quantize(Decimal("0.000001"))
        patched = http.patch(
            f"/v1/teams/{team_id}", headers=admin, json={"budget": {"limit": str(limit)}}
        )
        assert patched.status_code == 200, patched.text

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    clients = [
        context.Process(
            target=_client_process,
            args=(uvicorn_server, headers, spec, index, barrier, results),
        )
        for index in range(PROCESSES)
    ]
    started = time.monotonic()
    for process in clients:
        process.start()
    outcomes: list[tuple[int, dict | str]] = []
    try:
        for _ in clients:
            outcomes.extend(results.get(timeout=90)[1])
    finally:
        for process in clients:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    elapsed = time.monotonic() - started
    codes = [code for code, _ in outcomes]
    print(f"{len(codes)} submissions in {elapsed:.1f} s: {codes.count(201)} accepted")

    assert len(codes) == PROCESSES * PER_PROCESS
    errors = [o for o in outcomes if o[0] >= 500 or o[0] < 0]
    assert not errors, (
        f"{len(errors)} server errors or no answer: {errors[:3]}\n"
        + "\n".join(line for line in server_log.read_text().splitlines() if "Error" in line)[-3000:]
    )
    accepted_ids = [body["id"] for code, body in outcomes if code == 201]  # type: ignore[index]

    each_micros, limit_micros = to_micros(each), to_micros(limit)
    with Session(db_engine) as session:
        reserves = session.exec(
            select(LedgerEntry.job_id, LedgerEntry.amount_micros).where(
                LedgerEntry.team_id == team_id, LedgerEntry.kind == "reserve"
            )
        ).all()
        jobs = session.exec(
            select(func.count()).select_from(Job).where(Job.team_id == team_id)
        ).one()
        accepted_reserved = session.exec(
            select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
                LedgerEntry.kind == "reserve", col(LedgerEntry.job_id).in_(accepted_ids)
            )
        ).one()
        team = session.get(Team, team_id)
        assert team is not None
        figures = team_budget(session, team, datetime.now(UTC))

    # The guarantee: never more reserved than the budget.
    assert accepted_reserved <= limit_micros, (
        f"overspend: {len(accepted_ids)} accepted reserve {accepted_reserved} micro-USD, "
        f"the budget is {limit_micros} (over by {accepted_reserved - limit_micros})"
    )
    assert figures.available >= 0, f"overspend: available {figures.available} micro-USD"
    # And exactly: N fit, every other one is refused for the budget.
    assert codes.count(201) == ACCEPTED, sorted(set(codes))
    refused = [body for code, body in outcomes if code == 402]
    assert len(refused) == PROCESSES * PER_PROCESS - ACCEPTED, sorted(set(codes))
    for body in refused:
        assert isinstance(body, dict) and body["detail"]["code"] == "budget_exceeded", body
        message = body["detail"]["message"]
        assert "available" in message and "needs" in message, message
    assert len(set(accepted_ids)) == ACCEPTED
    assert jobs == ACCEPTED  # refused submissions left no job behind
    assert sorted(job_id for job_id, _ in reserves) == sorted(accepted_ids)
    assert {amount for _, amount in reserves} == {each_micros}
    assert accepted_reserved == ACCEPTED * each_micros <= limit_micros
    assert figures.reserved == ACCEPTED * each_micros and figures.spent == 0
    assert elapsed < 60, f"took {elapsed:.1f} s"
