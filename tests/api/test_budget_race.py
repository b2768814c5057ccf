"""Concurrent submissions at the edge of a budget never overspend (real server, real DB)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
from sqlalchemy import func
from sqlmodel import Session, select

from broker.db.models import LedgerEntry
from tests.helpers import job_spec, reservation


def test_fifty_concurrent_submissions_accept_exactly_ten(
    live_server, client, make_team, admin_headers, db_engine
):
    team, headers = make_team(limit="1000.00", period="total")
    spec = job_spec(max_cost="10.00", workload={"model": "ResNet-50", "steps": 4000})
    each = Decimal(reservation(client, make_team, spec))
    client.patch(
        f"/v1/teams/{team['id']}", headers=admin_headers, json={"budget": {"limit": str(each * 10)}}
    )

    def submit(i: int) -> int:
        with httpx.Client(base_url=live_server, headers=headers, timeout=60) as http:
            return http.post("/v1/jobs", json={**spec, "name": f"race-{i}"}).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        codes = list(pool.map(submit, range(50)))

    assert codes.count(201) == 10, codes
    assert codes.count(402) == 40, codes
    with Session(db_engine) as session:
        reserved = session.exec(
            select(func.sum(LedgerEntry.amount_micros)).where(
                LedgerEntry.team_id == team["id"], LedgerEntry.kind == "reserve"
            )
        ).one()
        entries = session.exec(
            select(func.count()).select_from(LedgerEntry).where(LedgerEntry.team_id == team["id"])
        ).one()
    assert reserved == int(each * 10 * 1_000_000)
    assert entries == 10
    with httpx.Client(base_url=live_server, headers=headers) as http:
        budget = http.get("/v1/budget").json()
    assert Decimal(budget["available"]) == 0 and Decimal(budget["reserved"]) == each * 10


def test_concurrent_retries_with_one_idempotency_key_make_one_job_and_one_reservation(
    live_server, make_team, db_engine
):
    team, headers = make_team(limit="1000.00")
    keyed = {**headers, "Idempotency-Key": "retry-storm"}
    spec = job_spec(name="once")

    def submit(_: int) -> tuple[int, str]:
        with httpx.Client(base_url=live_server, headers=keyed, timeout=60) as http:
            response = http.post("/v1/jobs", json=spec)
            return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(submit, range(12)))

    codes = [code for code, _ in answers]
    assert codes.count(201) == 1 and codes.count(200) == 11, codes
    assert len({job_id for _, job_id in answers}) == 1
    with Session(db_engine) as session:
        entries = session.exec(
            select(func.count()).select_from(LedgerEntry).where(LedgerEntry.team_id == team["id"])
        ).one()
    assert entries == 1
