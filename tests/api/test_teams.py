"""Admin routes: teams, budgets, keys."""

from __future__ import annotations

import time

import pytest


def test_admin_creates_team_with_budget(client, admin_headers):
    body = {"name": "vision", "budget": {"limit": "500.00", "period": "month", "alert_at": 0.75}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert response.status_code == 201
    team = response.json()
    assert team["name"] == "vision"
    assert team["budget"]["limit"] == "500.00"
    assert team["budget"]["available"] == "500.00"
    assert team["budget"]["period_start"] == "2026-12-01T00:00:00Z"
    assert team["budget"]["alert"] is False


def test_duplicate_team_name_is_conflict(client, admin_headers, make_team):
    make_team(name="nlp")
    body = {"name": "nlp", "budget": {"limit": "1.00"}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert response.status_code == 409
    assert response.json()["detail"]["code"] == "conflict"


def test_team_budget_float_is_rejected_naming_the_field(client, admin_headers):
    body = {"name": "x", "budget": {"limit": 12.5}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "budget", "limit"]


def test_negative_budget_is_rejected(client, admin_headers):
    body = {"name": "x", "budget": {"limit": "-1"}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "budget", "limit"]


def test_unknown_field_is_rejected(client, admin_headers):
    body = {"name": "x", "budget": {"limit": "1"}, "colour": "red"}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "colour"]


def test_list_and_get_teams(client, admin_headers, make_team):
    first, _ = make_team(name="a")
    second, _ = make_team(name="b")
    listed = client.get("/v1/teams", headers=admin_headers).json()
    assert [t["id"] for t in listed] == [first["id"], second["id"]]
    one = client.get(f"/v1/teams/{second['id']}", headers=admin_headers)
    assert one.status_code == 200 and one.json()["name"] == "b"
    assert client.get("/v1/teams/team_nope", headers=admin_headers).status_code == 404


def test_patch_budget(client, admin_headers, make_team):
    team, _ = make_team(limit="100.00")
    response = client.patch(
        f"/v1/teams/{team['id']}",
        headers=admin_headers,
        json={"budget": {"limit": "250.50", "period": "total"}},
    )
    assert response.status_code == 200
    assert response.json()["budget"]["limit"] == "250.50"
    assert response.json()["budget"]["period"] == "total"
    assert response.json()["budget"]["period_start"] is None
    bad = client.patch(
        f"/v1/teams/{team['id']}", headers=admin_headers, json={"budget": {"alert_at": 2}}
    )
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "budget", "alert_at"]


def test_key_token_shown_once_and_works(client, admin_headers, make_team):
    team, _ = make_team()
    created = client.post(
        f"/v1/teams/{team['id']}/keys", json={"name": "laptop"}, headers=admin_headers
    )
    assert created.status_code == 201
    token = created.json()["token"]
    assert created.json()["prefix"] == token[:12]
    assert client.get("/v1/budget", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    listed = client.get(f"/v1/teams/{team['id']}", headers=admin_headers).text
    assert token not in listed


def _working_key(client, admin_headers, make_team):
    """A new team and a second key of it, shown to work: (team, key json, its headers)."""
    team, _ = make_team()
    created = client.post(
        f"/v1/teams/{team['id']}/keys", json={"name": "k"}, headers=admin_headers
    ).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert client.get("/v1/budget", headers=headers).status_code == 200
    return team, created, headers


def test_revoked_key_stops_working_at_once(client, admin_headers, make_team):
    team, created, headers = _working_key(client, admin_headers, make_team)
    revoked = client.delete(f"/v1/teams/{team['id']}/keys/{created['id']}", headers=admin_headers)
    assert revoked.status_code == 204
    assert client.get("/v1/budget", headers=headers).status_code == 401


def test_revoking_another_teams_key_is_not_found(client, admin_headers, make_team):
    team_a, _ = make_team()
    team_b, _ = make_team()
    key_b = client.post(
        f"/v1/teams/{team_b['id']}/keys", json={"name": "k"}, headers=admin_headers
    ).json()
    response = client.delete(f"/v1/teams/{team_a['id']}/keys/{key_b['id']}", headers=admin_headers)
    assert response.status_code == 404


def test_team_key_cannot_use_admin_routes(client, make_team):
    _, headers = make_team()
    assert client.get("/v1/teams", headers=headers).status_code == 403


def test_key_for_missing_team_is_not_found(client, admin_headers):
    response = client.post("/v1/teams/team_missing/keys", json={"name": "k"}, headers=admin_headers)
    assert response.status_code == 404
    assert response.json()["detail"]["code"] == "not_found"


def _revoke_elsewhere(db_engine, key_id: str) -> None:
    """Revoke a key as another API process would: in the database, not through this one."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from broker.db.models import ApiKey

    with db_engine.begin() as connection:
        connection.execute(
            update(ApiKey).where(ApiKey.id == key_id).values(revoked_at=datetime.now(UTC))
        )


@pytest.fixture
def key_check(monkeypatch):
    """Set BROKER_KEY_CHECK_SECONDS for one test."""
    from broker.settings import get_settings

    def _set(seconds: float) -> None:
        monkeypatch.setenv("BROKER_KEY_CHECK_SECONDS", str(seconds))
        get_settings.cache_clear()

    yield _set
    monkeypatch.undo()
    get_settings.cache_clear()


def test_a_key_revoked_by_another_process_stops_within_the_check_interval(
    client, admin_headers, make_team, db_engine, key_check
):
    key_check(0.5)
    team, created, headers = _working_key(client, admin_headers, make_team)
    checked = time.monotonic()
    _revoke_elsewhere(db_engine, created["id"])
    # This process checked the key less than key_check_seconds ago: it trusts it without a
    # query, so it has not seen the revocation yet...
    if time.monotonic() - checked < 0.4:
        assert client.get("/v1/budget", headers=headers).status_code == 200
    time.sleep(max(0.0, 0.5 - (time.monotonic() - checked)) + 0.05)
    # ...and reads it again once that time is up.
    assert client.get("/v1/budget", headers=headers).status_code == 401
    assert client.get("/v1/budget", headers=headers).status_code == 401


def test_with_no_check_interval_every_request_reads_the_key(
    client, admin_headers, make_team, db_engine, key_check
):
    key_check(0)
    team, created, headers = _working_key(client, admin_headers, make_team)
    _revoke_elsewhere(db_engine, created["id"])
    assert client.get("/v1/budget", headers=headers).status_code == 401


def test_a_key_this_process_revoked_is_never_trusted_again():
    """A check that read the key live just before this process revoked it cannot trust it
    afterwards (the request and the revocation ran in two threads)."""
    from broker.services.teams import TrustedKeys

    keys = TrustedKeys()
    keys.trust("digest", "team_a")
    assert keys.team("digest", 60) == "team_a"
    keys.forget("digest", revoked=True)
    keys.trust("digest", "team_a")  # the late check's result
    assert keys.team("digest", 60) is None
    assert keys.team("digest", 0) is None
