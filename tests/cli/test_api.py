"""The client commands' errors: the API's words on one line, and what to check."""

from __future__ import annotations

import socket

from tests.cli.support import failed


def test_domain_errors_print_the_api_message(broker_cli, team_key, admin_token):
    _, token = team_key
    out = failed(broker_cli("jobs", "show", "job_missing", token=token))
    assert "not_found" in out and "HTTP 404" in out
    out = failed(broker_cli("admin", "team", "list", token=token))
    assert "this route needs the admin token" in out and "BROKER_API_TOKEN" in out
    out = failed(broker_cli("admin", "team", "create", "x", "--limit", "ten", token=admin_token))
    assert "budget.limit" in out
    out = failed(broker_cli("jobs", "list", "--status", "bogus", token=token))
    assert "query.status" in out


def test_unreachable_api_and_missing_token_are_one_clear_line(broker_cli, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("BROKER_API_URL", closed)
    result = broker_cli("jobs", "list", token="whatever")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert f"cannot reach the broker API at {closed}" in result.output
    assert "Set BROKER_API_URL to its address" in result.output

    result = broker_cli("spend", token=None)
    assert result.exit_code == 1 and "set BROKER_API_TOKEN" in result.output
    result = broker_cli("admin", "team", "list", token="")
    assert result.exit_code == 1 and "BROKER_API_TOKEN to the admin token" in result.output


def test_invalid_api_url_is_one_clear_line(broker_cli, monkeypatch):
    monkeypatch.setenv("BROKER_API_URL", "http://[::1")
    result = broker_cli("jobs", "list", token="whatever")
    assert result.exit_code == 1
    assert "BROKER_API_URL 'http://[::1' is not a valid URL" in result.output
