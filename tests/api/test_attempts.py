"""The agent route over HTTP: what an instance, or anyone holding its token, cannot make the
broker believe (issue 21). Refusals are 422s naming the field, 404, 409 or 401."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session

from broker.core.agent_tokens import token_expiry
from broker.db.models import Job
from broker.services import lifecycle
from broker.services.launch_request import agent_token
from broker.services.plans import job_plan
from tests.helpers import LEASE, job_spec


@pytest.fixture
def running(client, make_team, db_engine, clock):  # type: ignore[no-untyped-def]
    """Submit a job and launch an attempt on its plan; (job id, attempt id, token, team)."""

    def _running() -> tuple[str, str, str, dict[str, str]]:
        _, team = make_team()
        job = client.post("/v1/jobs", json=job_spec(), headers=team).json()
        with Session(db_engine, expire_on_commit=False) as session:
            row = session.get(Job, job["id"])
            attempt, token = lifecycle.begin_attempt(
                session,
                row.id,
                job_plan(row),
                clock.now(),
                token_for=lambda attempt_id: agent_token("s", attempt_id, row.deadline),
            )
            lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        return job["id"], attempt.id, token, team

    return _running


def post(client, attempt_id: str, token: str, **body: object):  # type: ignore[no-untyped-def]
    return client.post(
        f"/v1/attempts/{attempt_id}/progress",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_1e12_report_is_a_422_saying_the_most_credible_and_the_job_runs_on(
    client, running, clock
):
    job_id, attempt_id, token, team = running()
    clock.advance(1800)
    before = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    refused = post(client, attempt_id, token, work_done=1e12)
    assert refused.status_code == 422, refused.text
    [error] = refused.json()["detail"]
    assert error["loc"] == ["body", "work_done"] and "at most" in error["msg"]
    after = client.get(f"/v1/jobs/{job_id}", headers=team).json()
    assert after["status"] == "running" and after["reserved"] == before["reserved"] != "0.00"
    assert after["progress"] == before["progress"]


def test_a_foreign_checkpoint_key_is_a_422_naming_the_field_and_the_prefix(client, running, clock):
    job_id, attempt_id, token, team = running()
    other_id, _, _, _ = running()
    clock.advance(3600)
    for key in (f"jobs/{other_id}/ckpt", f"jobs/{job_id}/../{other_id}/x", "s3://b/x"):
        refused = post(client, attempt_id, token, work_done=100, checkpoint_key=key)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["detail"]
        assert error["loc"] == ["body", "checkpoint_key"] and f"jobs/{job_id}/" in error["msg"]
    assert client.get(f"/v1/jobs/{job_id}", headers=team).json()["checkpoints"] == []
    ok = post(client, attempt_id, token, work_done=100, checkpoint_key=f"jobs/{job_id}/c")
    assert ok.status_code == 200, ok.text


def test_one_attempts_token_is_a_404_on_another_attempt(client, running, clock):
    _, attempt_a, token_a, _ = running()
    _, attempt_b, token_b, _ = running()
    clock.advance(600)
    assert post(client, attempt_b, token_a, work_done=1).status_code == 404
    assert post(client, attempt_b, token_b, work_done=1).status_code == 200


def test_an_ended_attempts_token_is_a_409(client, running, clock, db_engine):
    job_id, attempt_id, token, team = running()
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=team).status_code == 202
    assert post(client, attempt_id, token, work_done=1).status_code == 409


def test_an_expired_token_is_a_401(client, running, clock, db_engine):
    job_id, attempt_id, token, _ = running()
    with Session(db_engine) as session:
        expiry = token_expiry(session.get(Job, job_id).deadline)
    clock.set(expiry - timedelta(seconds=1))
    assert post(client, attempt_id, token, work_done=1).status_code == 200
    clock.set(expiry)
    expired = post(client, attempt_id, token, work_done=2)
    assert expired.status_code == 401, expired.text
    assert "expired" in expired.json()["detail"]["message"]
