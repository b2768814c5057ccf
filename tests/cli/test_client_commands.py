"""The ``broker`` API commands through Typer's test runner, against a real uvicorn server."""

from __future__ import annotations

import re
import socket
import threading
import time
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from broker.cli import app
from broker.core.job_status import JobStatus
from broker.core.money import to_micros
from broker.services import lifecycle
from broker.settings import get_settings
from tests.conftest import START

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
runner = CliRunner()


@pytest.fixture
def broker_cli(live_server, monkeypatch):
    """``run(*args, token=...)``: the ``broker`` CLI on the live server with that token."""
    monkeypatch.setenv("BROKER_API_URL", live_server)

    def run(*args: str, token: str | None):  # type: ignore[no-untyped-def]
        if token is None:
            monkeypatch.delenv("BROKER_API_TOKEN", raising=False)
        else:
            monkeypatch.setenv("BROKER_API_TOKEN", token)
        get_settings.cache_clear()
        return runner.invoke(app, list(args))

    yield run
    get_settings.cache_clear()


@pytest.fixture
def admin_token(admin_headers) -> str:
    return admin_headers["Authorization"].removeprefix("Bearer ")


@pytest.fixture
def team_key(make_team) -> tuple[dict, str]:
    team, headers = make_team(limit="1000.00")
    return team, headers["Authorization"].removeprefix("Bearer ")


def job_file(tmp_path: Path, name: str = "job.yaml", **fields: str) -> Path:
    lines = {
        "name": "resnet",
        "workload": "{model: ResNet-50, batch_size: 128, steps: 40000}",
        "resources": "{gpus: 1}",
        "deadline": "+12h",
        "max_cost": "100.00",
        **fields,
    }
    path = tmp_path / name
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


def failed(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no crash
    assert "Traceback" not in result.output
    return result.output


def submitted_id(output: str) -> str:
    match = re.search(r"submitted job (\S+)", output)
    assert match, output
    return match.group(1)


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


def test_quote_of_the_example_file_prints_ranked_plans(broker_cli, team_key, client):
    _, token = team_key
    out = ok(broker_cli("quote", str(EXAMPLE), token=token))
    for header in ("provider", "zone", "instance type", "GPU", "market", "$/h", "exp. hours"):
        assert header in out
    assert "worst case" in out and "p_deadline" in out and "cheapest on-demand" in out
    spec = {
        "name": "resnet50-imagenet",
        "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 100000},
        "resources": {"gpus": 1},
        "deadline": (START + timedelta(hours=12)).isoformat(),
        "max_cost": "100.00",
    }
    headers = {"Authorization": f"Bearer {token}"}
    best = client.post("/v1/quotes", json=spec, headers=headers).json()["plans"][0]
    first_row = next(line for line in out.splitlines() if re.match(r"\W*1\W", line))
    assert best["instance_type"] in first_row and best["zone"] in first_row


def test_submit_list_show_and_cancel(broker_cli, team_key, tmp_path, client):
    _, token = team_key
    spec = job_file(tmp_path, max_cost="80")  # a number: sent as the string "80"
    out = ok(broker_cli("jobs", "submit", str(spec), token=token))
    job_id = submitted_id(out)
    assert "queued" in out and "reserved" in out
    job = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()
    assert job["max_cost"] == "80.00"
    assert job["deadline"].startswith((START + timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M"))

    again = ok(broker_cli("jobs", "submit", str(spec), "--idempotency-key", "k1", token=token))
    same = ok(broker_cli("jobs", "submit", str(spec), "--idempotency-key", "k1", token=token))
    assert f"job {submitted_id(again)} was already submitted" in same

    listed = ok(broker_cli("jobs", "list", "--page-size", "1", token=token))  # a page per job
    assert job_id in listed and submitted_id(again) in listed and "2 job(s)" in listed
    assert "queued" in ok(broker_cli("jobs", "list", "--status", "queued", token=token))

    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    assert job_id in shown and "queued" in shown and "checkpoints" in shown
    assert "no attempts yet" in shown

    cancelled = ok(broker_cli("jobs", "cancel", job_id, token=token))
    assert "cancelled" in cancelled
    out = failed(broker_cli("jobs", "cancel", job_id, token=token))
    assert "conflict" in out and "HTTP 409" in out


@pytest.mark.timeout(30)  # a watch that never ends fails here, not at the suite's limit
def test_show_watch_and_spend_of_a_job_that_ran(
    broker_cli, team_key, tmp_path, db_engine, clock, live_server, client
):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    plan = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()[
        "plan"
    ]
    # Play the worker's part: an attempt on the job's plan, reporting progress and a checkpoint.
    with Session(db_engine, expire_on_commit=False) as session:
        attempt, attempt_token = lifecycle.begin_attempt(
            session, job_id, plan, to_micros(plan["price_per_hour"]), clock.now()
        )
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now())
    agent = {"Authorization": f"Bearer {attempt_token}"}
    progress = f"{live_server}/v1/attempts/{attempt.id}/progress"
    report = httpx.post(
        progress, json={"work_done": 10000, "checkpoint_key": "ckpt/1"}, headers=agent
    )
    assert report.status_code == 200, report.text
    clock.advance(3600)

    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    assert attempt.id in shown and plan["instance_type"] in shown and "running" in shown
    assert "checkpoints  1 (latest at 10,000: ckpt/1)" in shown

    def finish_soon() -> None:
        time.sleep(0.5)
        httpx.post(progress, json={"work_done": 40000}, headers=agent)
        with Session(db_engine, expire_on_commit=False) as session:
            lifecycle.stop(session, job_id, JobStatus.SUCCEEDED, "work reached", clock.now())

    worker = threading.Thread(target=finish_soon)
    worker.start()
    watched = ok(broker_cli("jobs", "watch", "--interval", "0.1", token=token))  # no ids
    worker.join()
    assert job_id in watched and "succeeded" in watched and "40,000 / 40,000" in watched
    assert "all 1 finished: 1 succeeded" in watched

    hour = Decimal(plan["price_per_hour"]).quantize(Decimal("0.01"), ROUND_HALF_UP)
    out = ok(broker_cli("spend", "--by", "provider", token=token))
    assert plan["provider"] in out and f"${hour}" in out and "total" in out
    by_job = ok(broker_cli("spend", "--by", "job", "--start", "2026-12-01T00:00:00Z", token=token))
    assert job_id in by_job and f"${hour}" in by_job
    empty = ok(broker_cli("spend", "--end", "2026-12-01T00:00:00Z", token=token))
    assert "total" in empty and "$0.00" in empty


@pytest.mark.timeout(30)
def test_watch_ends_at_once_for_a_cancelled_job(broker_cli, team_key, tmp_path):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    ok(broker_cli("jobs", "cancel", job_id, token=token))
    started = time.monotonic()
    out = ok(broker_cli("jobs", "watch", job_id, "--interval", "5", token=token))
    assert time.monotonic() - started < 3
    assert job_id in out and "cancelled" in out and "1 cancelled" in out
    assert "no unfinished jobs" in ok(broker_cli("jobs", "watch", token=token))


def test_invalid_spec_names_the_field(broker_cli, team_key, tmp_path):
    _, token = team_key
    bad = job_file(tmp_path, resources="{gpus: 0}")
    out = failed(broker_cli("jobs", "submit", str(bad), token=token))
    assert "resources.gpus" in out and "HTTP 422" in out
    out = failed(
        broker_cli("quote", str(job_file(tmp_path, deadline="2026-12-05T12:00:00")), token=token)
    )
    assert "deadline" in out and "HTTP 422" in out
    out = failed(broker_cli("quote", str(job_file(tmp_path, deadline="+8 parsecs")), token=token))
    assert "+8 parsecs" in out and "+8h" in out
    out = failed(broker_cli("jobs", "list", "--status", "bogus", token=token))
    assert "query.status" in out
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    out = failed(broker_cli("quote", str(tmp_path / "broken.yaml"), token=token))
    assert "not valid YAML" in out


def test_domain_errors_print_the_api_message(broker_cli, team_key, admin_token, tmp_path):
    _, token = team_key
    out = failed(broker_cli("jobs", "show", "job_missing", token=token))
    assert "not_found" in out and "HTTP 404" in out
    out = failed(broker_cli("quote", str(job_file(tmp_path, max_cost='"0.01"')), token=token))
    assert "infeasible" in out
    out = failed(broker_cli("admin", "team", "list", token=token))
    assert "this route needs the admin token" in out and "BROKER_API_TOKEN" in out
    out = failed(broker_cli("admin", "team", "create", "x", "--limit", "ten", token=admin_token))
    assert "budget.limit" in out


def test_unreachable_api_and_missing_token_are_one_clear_line(broker_cli, monkeypatch, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("BROKER_API_URL", closed)
    result = broker_cli("jobs", "list", token="whatever")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert f"cannot reach the broker API at {closed}" in result.output

    result = broker_cli("spend", token=None)
    assert result.exit_code == 1 and "set BROKER_API_TOKEN" in result.output
    result = broker_cli("admin", "team", "list", token="")
    assert result.exit_code == 1 and "BROKER_API_TOKEN to the admin token" in result.output
