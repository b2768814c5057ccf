"""``broker spend``: the team's spend grouped by provider, job or day, with a total."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from sqlmodel import Session

from broker.core.job_status import JobStatus
from broker.db.models import Job
from broker.services import lifecycle
from broker.services.plans import job_plan
from tests.cli.support import job_file, ok, submitted_id
from tests.helpers import LEASE


def test_spend_of_an_hour_on_the_plan_by_provider_job_and_time(
    broker_cli, team_key, tmp_path, db_engine, clock, client
):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    headers = {"Authorization": f"Bearer {token}"}
    plan = client.get(f"/v1/jobs/{job_id}", headers=headers).json()["plan"]
    with Session(db_engine, expire_on_commit=False) as session:
        attempt, _ = lifecycle.begin_attempt(
            session, job_id, job_plan(session.get(Job, job_id)), clock.now()
        )
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    clock.advance(3600)
    with Session(db_engine, expire_on_commit=False) as session:
        lifecycle.stop(session, job_id, JobStatus.SUCCEEDED, "work reached", clock.now())

    hour = Decimal(plan["price_per_hour"]).quantize(Decimal("0.01"), ROUND_HALF_UP)
    out = ok(broker_cli("spend", "--by", "provider", token=token))
    assert plan["provider"] in out and f"${hour}" in out and "total" in out
    by_job = ok(broker_cli("spend", "--by", "job", "--start", "2026-12-01T00:00:00Z", token=token))
    assert job_id in by_job and f"${hour}" in by_job
    empty = ok(broker_cli("spend", "--end", "2026-12-01T00:00:00Z", token=token))
    assert "total" in empty and "$0.00" in empty
