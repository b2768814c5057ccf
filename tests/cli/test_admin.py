"""``broker admin``: teams, budgets and keys through the CLI, against a real server."""

from __future__ import annotations

import re

from tests.cli.support import failed, ok


def test_team_create_list_and_budget(broker_cli, admin_token, client, admin_headers):
    out = ok(
        broker_cli(
            "admin",
            "team",
            "create",
            "vision",
            "--limit",
            "500.00",
            "--alert-at",
            "0.7",
            token=admin_token,
        )
    )
    team = next(
        t for t in client.get("/v1/teams", headers=admin_headers).json() if t["name"] == "vision"
    )
    assert team["id"] in out and "$500.00 per month" in out and "70%" in out
    assert team["budget"]["alert_at"] == 0.7

    listed = ok(broker_cli("admin", "team", "list", token=admin_token))
    assert team["id"] in listed and "vision" in listed and "$500.00" in listed

    ok(
        broker_cli(
            "admin",
            "team",
            "budget",
            team["id"],
            "--limit",
            "750",
            "--alert-at",
            "0.5",
            token=admin_token,
        )
    )
    budget = client.get(f"/v1/teams/{team['id']}", headers=admin_headers).json()["budget"]
    assert budget["limit"] == "750.00" and budget["alert_at"] == 0.5


def test_team_budget_without_a_change_is_a_usage_error(broker_cli, admin_token):
    result = broker_cli("admin", "team", "budget", "team_x", token=admin_token)
    assert result.exit_code == 2 and "give --limit, --alert-at or --period" in result.output


def test_created_key_works_until_revoked_then_gets_401(broker_cli, admin_token, make_team):
    team, _ = make_team()
    out = ok(
        broker_cli("admin", "key", "create", team["id"], "--name", "laptop", token=admin_token)
    )
    token = re.search(r"token: (\S+)", out).group(1)
    key_id = re.search(r"created key (\S+)", out).group(1)
    assert "shown only now" in out
    ok(broker_cli("jobs", "list", token=token))

    ok(broker_cli("admin", "key", "revoke", team["id"], key_id, token=admin_token))
    out = failed(broker_cli("jobs", "list", token=token))
    assert "missing or invalid bearer token" in out and "HTTP 401" in out
