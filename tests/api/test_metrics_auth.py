"""``GET /metrics`` without credentials (or with a team key) names no team and shows no money;
the admin token or ``BROKER_METRICS_TOKEN`` adds each team's money; any other token is a 401."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.settings import get_settings
from tests.helpers import job_spec

METRICS_TOKEN = "mtr_for_the_scraper_only"


@pytest.fixture
def metrics_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("BROKER_METRICS_TOKEN", METRICS_TOKEN)
    get_settings.cache_clear()
    yield METRICS_TOKEN
    monkeypatch.delenv("BROKER_METRICS_TOKEN")
    get_settings.cache_clear()


@pytest.fixture
def teams(client, make_team) -> list[str]:  # type: ignore[no-untyped-def]
    """Two teams with a queued job each (so each has money reserved); their names."""
    names = ["vision-secret-name", "nlp-secret-name"]
    for name in names:
        _, headers = make_team(name=name)
        response = client.post("/v1/jobs", json=job_spec(), headers=headers)
        assert response.status_code == 201, response.text
    return names


def families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.mark.parametrize("who", ["nobody", "team"])
def test_without_the_metrics_token_metrics_name_no_team_and_show_no_money(
    client, teams, make_team, who
) -> None:  # type: ignore[no-untyped-def]
    _, team_headers = make_team(name="curious")
    response = client.get("/metrics", headers=team_headers if who == "team" else {})

    assert response.status_code == 200
    assert not [name for name in [*teams, "curious"] if name in response.text]
    assert not [f for f in families(response.text) if f.startswith("broker_team_")]
    assert "usd" not in response.text.lower()
    assert {"broker_jobs", "broker_launches", "broker_preemptions"} <= families(response.text)
    assert 'broker_jobs{status="queued"} 2.0' in response.text


@pytest.mark.parametrize("who", ["admin", "metrics"])
def test_the_admin_or_metrics_token_also_shows_each_teams_money(
    client, teams, admin_headers, metrics_token, who
) -> None:  # type: ignore[no-untyped-def]
    headers = admin_headers if who == "admin" else {"Authorization": f"Bearer {metrics_token}"}
    response = client.get("/metrics", headers=headers)

    assert response.status_code == 200
    for name in teams:
        assert f'broker_team_reserved_usd{{team="{name}"}}' in response.text
        assert f'broker_team_spent_usd{{team="{name}"}}' in response.text


def test_a_wrong_token_is_401(client, make_team, admin_headers, metrics_token) -> None:  # type: ignore[no-untyped-def]
    team, _ = make_team(name="curious")
    key = client.post(f"/v1/teams/{team['id']}/keys", json={"name": "k"}, headers=admin_headers)
    client.delete(f"/v1/teams/{team['id']}/keys/{key.json()['id']}", headers=admin_headers)
    for headers in (
        {"Authorization": f"Bearer {key.json()['token']}"},  # revoked
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {metrics_token}"},
    ):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert "curious" not in response.text
