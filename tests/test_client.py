"""``BrokerClient`` against the real app under uvicorn on loopback: every call it makes, and
the API's errors as exceptions."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from broker.client import BrokerApiError, BrokerClient, BrokerUnreachable
from tests.conftest import ADMIN_TOKEN, START
from tests.helpers import job_spec


@pytest.fixture
def admin(live_server: str) -> Iterator[BrokerClient]:
    with BrokerClient(live_server, ADMIN_TOKEN) as client:
        yield client


@pytest.fixture
def team(admin: BrokerClient) -> Iterator[BrokerClient]:
    """A client with the key of a new team with $1,000 a month."""
    created = admin.create_team("sdk", "1000.00")
    with admin.with_token(admin.create_key(created["id"], "sdk")["token"]) as client:
        yield client


def test_teams_budgets_and_keys(admin: BrokerClient) -> None:
    team = admin.create_team("vision", Decimal("500.00"), period="total", alert_at=0.5)
    assert team["budget"] == {**team["budget"], "limit": "500.00", "period": "total"}
    assert team["id"] in {t["id"] for t in admin.list_teams()}
    assert admin.get_team(team["id"])["name"] == "vision"
    updated = admin.update_budget(team["id"], limit="750", alert_at=0.9)
    assert updated["budget"]["limit"] == "750.00" and updated["budget"]["alert_at"] == 0.9
    assert updated["budget"]["period"] == "total"  # not given: unchanged

    key = admin.create_key(team["id"], "laptop")
    with admin.with_token(key["token"]) as member:
        assert member.budget()["limit"] == "750.00"
        admin.revoke_key(team["id"], key["id"])
        with pytest.raises(BrokerApiError) as refused:
            member.budget()
    assert refused.value.status == 401 and refused.value.code == "unauthorized"


def test_quote_submit_get_cancel_and_spend(team: BrokerClient) -> None:
    spec = job_spec(deadline=START + timedelta(days=2), max_cost=Decimal("250.00"))
    quote = team.quote(spec)
    job = team.submit_job(spec)
    assert job["status"] == "queued" and job["plan"] == quote["plans"][0]
    assert team.get_job(job["id"])["deadline"] == job["deadline"]
    assert team.cancel_job(job["id"])["status"] == "cancelled"
    spend = team.spend("job", start=START - timedelta(days=1), end="2027-01-01T00:00:00Z")
    assert spend == {"rows": [], "total": "0.00"}  # cancelled before any attempt ran
    assert datetime.fromisoformat(team.health()["time"]) == START
    assert "broker_jobs" in team.metrics()


def test_idempotent_submit_of_a_relative_deadline_is_the_same_job(team: BrokerClient, clock):
    spec = job_spec(deadline="+12h")
    job, created = team.submit_job_idempotent(spec, "nightly-7")
    clock.advance(600)
    again, created_again = team.submit_job_idempotent(spec, "nightly-7")
    assert (created, created_again) == (True, False)
    assert again["id"] == job["id"] and again["deadline"] == job["deadline"]
    assert team.submit_job(spec, idempotency_key="nightly-7")["id"] == job["id"]
    with pytest.raises(BrokerApiError) as conflict:
        team.submit_job({**spec, "max_cost": "99.00"}, idempotency_key="nightly-7")
    assert conflict.value.status == 409 and conflict.value.code == "conflict"
    assert "nightly-7" in conflict.value.message
    assert str(conflict.value).endswith("(conflict, HTTP 409)")


def test_pages_follow_the_cursor_newest_first(team: BrokerClient, clock) -> None:
    ids = []
    for i in range(5):
        ids.append(team.submit_job(job_spec(name=f"job-{i}"))["id"])
        clock.advance(1)
    first = team.list_jobs(limit=2)
    assert [j["id"] for j in first["items"]] == ids[:-3:-1] and first["next_cursor"]
    second = team.list_jobs(limit=2, cursor=first["next_cursor"])
    assert [j["id"] for j in second["items"]] == ids[-3:-5:-1]
    assert [j["id"] for j in team.iter_jobs(page_size=2)] == ids[::-1]
    assert list(team.iter_jobs("running")) == []


def test_over_budget_is_402_with_the_api_code_and_message(admin: BrokerClient) -> None:
    poor = admin.create_team("poor", "0.50")
    key = admin.create_key(poor["id"], "k")["token"]
    with admin.with_token(key) as team, pytest.raises(BrokerApiError) as error:
        team.submit_job(job_spec())
    assert error.value.status == 402 and error.value.code == "budget_exceeded"
    assert "0.50" in error.value.message
    assert error.value.detail == {"code": "budget_exceeded", "message": error.value.message}


def test_missing_job_is_404(team: BrokerClient) -> None:
    with pytest.raises(BrokerApiError) as error:
        team.get_job("job_missing")
    assert (error.value.status, error.value.code) == (404, "not_found")
    with pytest.raises(BrokerApiError) as odd:
        team.get_job("../teams")  # quoted into the path, never another route
    assert odd.value.status in (404, 422)


def test_validation_error_names_the_fields(team: BrokerClient) -> None:
    bad = job_spec(resources={"gpus": 0}, deadline="+8 parsecs")
    with pytest.raises(BrokerApiError) as error:
        team.quote(bad)
    assert error.value.status == 422 and error.value.code == "invalid"
    assert set(error.value.fields) == {"resources.gpus", "deadline"}
    assert "resources.gpus: " in error.value.message and "deadline: " in error.value.message
    assert str(error.value).endswith("(HTTP 422)")
    with pytest.raises(BrokerApiError) as past:
        team.submit_job(job_spec(deadline="+0s"))
    assert past.value.fields == ["deadline"] and "in the past" in past.value.message


def test_closed_port_is_unreachable_naming_the_url() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with BrokerClient(url, "tok") as client, pytest.raises(BrokerUnreachable) as error:
        client.health()
    assert error.value.status is None and error.value.code == "unreachable"
    assert f"cannot reach the broker API at {url}" in str(error.value)


def test_silent_server_is_a_timeout_naming_the_url() -> None:
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = BrokerClient(url, "tok", timeout=0.2)
        with client, pytest.raises(BrokerUnreachable) as error:
            client.health()
    assert error.value.code == "timeout" and url in error.value.message


def test_invalid_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a valid URL"):
        BrokerClient("http://[::1", "tok")
