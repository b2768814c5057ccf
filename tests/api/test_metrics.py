"""GET /metrics (database figures, the workers' multiprocess files) and the JSON logs."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from broker.logs import configure_logging
from broker.services import lifecycle
from broker.settings import Settings, get_settings
from tests.helpers import LEASE, SPOT_PLAN, chosen, job_spec

REPO = Path(__file__).resolve().parents[2]

SPOT_AZ2 = {**SPOT_PLAN, "zone": "use1-az2"}
ON_DEMAND_AZ1 = {**SPOT_PLAN, "market": "on_demand"}
GCP_SPOT = {
    "provider": "gcp",
    "region": "us-central1",
    "zone": "us-central1-a",
    "instance_type": "n1-standard-8-v100",
    "gpu": "V100",
    "gpu_count": 1,
    "market": "spot",
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client) -> tuple[Samples, str]:  # type: ignore[no-untyped-def]
    """GET /metrics with the admin token (so each team's money is in); its samples by (name,
    labels), and the raw text. tests/api/test_metrics_auth.py: what it shows without one."""
    admin = get_settings().admin_token
    assert admin is not None
    response = client.get(
        "/metrics", headers={"Authorization": f"Bearer {admin.get_secret_value()}"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, response.text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def submit(client, headers) -> dict:  # type: ignore[no-untyped-def]
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


def run_attempt(session, job_id, plan, price_micros, clock):  # type: ignore[no-untyped-def]
    attempt, token = lifecycle.begin_attempt(
        session, job_id, chosen(plan, price_micros), clock.now()
    )
    lifecycle.launch_succeeded(
        session, attempt.id, f"i-{attempt.id[-8:]}", clock.now(), lease_seconds=LEASE
    )
    return attempt, token


@pytest.fixture
def metrics_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The app's metrics folder pointed at an empty temporary one for the test."""
    folder = tmp_path / "metrics"
    monkeypatch.setenv("BROKER_METRICS_DIR", str(folder))
    get_settings.cache_clear()
    yield folder
    get_settings.cache_clear()


def test_metrics_count_jobs_money_and_attempts_from_the_database(
    client, make_team, admin_headers, clock, db_engine, metrics_dir
):
    vision, vision_headers = make_team(name="vision", period="month")
    nlp, nlp_headers = make_team(name="nlp", period="total")
    job_a, job_b = submit(client, vision_headers), submit(client, vision_headers)
    job_c, _job_d = submit(client, nlp_headers), submit(client, nlp_headers)
    assert client.post(f"/v1/jobs/{job_b['id']}/cancel", headers=vision_headers).status_code == 202

    tokens = []
    with Session(db_engine, expire_on_commit=False) as session:
        # Job A: spot in az1 preempted at once (60 s minimum at $0.918/h), a capacity refusal
        # in az2, then on-demand in az1 for an hour at $3.06/h.
        attempt, token = run_attempt(session, job_a["id"], SPOT_PLAN, 918_000, clock)
        lifecycle.preempted(session, attempt.id, clock.now())
        tokens.append(token)
        refused, token = lifecycle.begin_attempt(
            session, job_a["id"], chosen(SPOT_AZ2, 918_000), clock.now()
        )
        lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
        tokens.append(token)
        on_demand, token = run_attempt(session, job_a["id"], ON_DEMAND_AZ1, 3_060_000, clock)
        tokens.append(token)
        # Job C: GCP spot at $1/h, half an hour.
        gcp, token = run_attempt(session, job_c["id"], GCP_SPOT, 1_000_000, clock)
        tokens.append(token)
        clock.advance(1800)
        lifecycle.accrue(session, gcp.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
        clock.advance(1800)
        lifecycle.accrue(
            session, on_demand.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE
        )

    samples, text = scrape(client)

    assert value(samples, "broker_jobs", status="running") == 2
    assert value(samples, "broker_jobs", status="queued") == 1
    assert value(samples, "broker_jobs", status="cancelled") == 1
    assert value(samples, "broker_jobs", status="succeeded") == 0

    assert value(samples, "broker_team_spent_usd", team="vision") == pytest.approx(3.0753)
    assert value(samples, "broker_team_spent_usd", team="nlp") == pytest.approx(0.5)
    for name, headers in (("vision", vision_headers), ("nlp", nlp_headers)):
        budget = client.get("/v1/budget", headers=headers).json()
        assert value(samples, "broker_team_spent_usd", team=name) == float(budget["spent"])
        assert value(samples, "broker_team_reserved_usd", team=name) == float(budget["reserved"])
    assert value(samples, "broker_team_reserved_usd", team="vision") == pytest.approx(
        float(Decimal(job_a["reserved"]) - Decimal("3.0753"))
    )

    launches = "broker_launches_total"
    assert value(samples, launches, provider="aws", zone="use1-az1", market="spot") == 1
    assert value(samples, launches, provider="aws", zone="use1-az1", market="on_demand") == 1
    assert value(samples, launches, provider="aws", zone="use1-az2", market="spot") == 0
    assert value(samples, launches, provider="gcp", zone="us-central1-a", market="spot") == 1
    preemptions, capacity = "broker_preemptions_total", "broker_capacity_errors_total"
    assert value(samples, preemptions, provider="aws", zone="use1-az1") == 1
    assert value(samples, preemptions, provider="aws", zone="use1-az2") == 0
    assert value(samples, preemptions, provider="gcp", zone="us-central1-a") == 0
    assert value(samples, capacity, provider="aws", zone="use1-az2") == 1
    assert value(samples, capacity, provider="aws", zone="use1-az1") == 0

    secrets = [admin_headers["Authorization"].split()[1], *tokens]
    secrets += [h["Authorization"].split()[1] for h in (vision_headers, nlp_headers)]
    assert not [secret for secret in secrets if secret in text]
    assert "brk_" not in text and "adm_" not in text
    assert job_a["name"] not in text and "ResNet-50" not in text
    assert vision["id"] not in text and nlp["id"] not in text


def test_team_spend_follows_the_budget_period(client, make_team, clock, db_engine, metrics_dir):
    _, month_headers = make_team(name="monthly", period="month")
    _, total_headers = make_team(name="lifetime", period="total")
    jobs = [submit(client, month_headers), submit(client, total_headers)]
    with Session(db_engine, expire_on_commit=False) as session:
        attempts = [run_attempt(session, job["id"], SPOT_PLAN, 1_000_000, clock)[0] for job in jobs]
        clock.advance(3600)
        for attempt in attempts:
            lifecycle.accrue(
                session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE
            )
    clock.advance(timedelta(days=31).total_seconds())  # into January

    samples, _ = scrape(client)

    assert value(samples, "broker_team_spent_usd", team="monthly") == 0
    assert value(samples, "broker_team_spent_usd", team="lifetime") == pytest.approx(1.0)


def test_metrics_add_up_what_worker_processes_recorded(client, tmp_path, metrics_dir):
    record = (
        "from broker.services.metrics import PROVIDER_ERRORS, TICK_SECONDS\n"
        "TICK_SECONDS.labels('tick').observe(0.2)\n"
        "TICK_SECONDS.labels('observe').observe(0.05)\n"
        "PROVIDER_ERRORS.labels('aws', 'capacity').inc()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["BROKER_DATA_DIR"] = str(tmp_path)
    metrics_dir.mkdir()
    # One process the way prometheus_client documents it, one the way a Celery worker
    # gets it: importing the Celery app turns BROKER_METRICS_DIR into PROMETHEUS_MULTIPROC_DIR.
    subprocess.run(
        [sys.executable, "-c", record],
        env={**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        cwd=REPO,
        check=True,
    )
    subprocess.run(
        [sys.executable, "-c", "import tasks\n" + record],
        env={**env, "BROKER_METRICS_DIR": str(metrics_dir)},
        cwd=REPO,
        check=True,
    )
    assert len(list(metrics_dir.glob("*.db"))) == 4  # a counter and a histogram file each

    samples, _ = scrape(client)

    assert value(samples, "broker_tick_seconds_count", task="tick") == 2
    assert value(samples, "broker_tick_seconds_sum", task="tick") == pytest.approx(0.4)
    assert value(samples, "broker_tick_seconds_bucket", task="tick", le="0.25") == 2
    assert value(samples, "broker_tick_seconds_bucket", task="tick", le="0.1") == 0
    assert value(samples, "broker_tick_seconds_count", task="observe") == 2
    assert value(samples, "broker_provider_errors_total", provider="aws", kind="capacity") == 2
    assert value(samples, "broker_jobs", status="queued") == 0  # and the database figures


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root and server loggers back as they were after the test configures logging."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {
        name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers))
        for name in names
    }
    propagate = {name: logging.getLogger(name).propagate for name in names}
    yield
    for name, (level, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate[name]


def test_json_logs_carry_extras_and_redact_tokens(restore_logging):
    admin = "adm_short_but_configured"
    team_key = "brk_" + "K" * 43
    agent = "att_" + "f" * 40
    stream = io.StringIO()
    configure_logging(Settings(log_format="json", admin_token=admin), level="INFO", stream=stream)
    log = logging.getLogger("broker.services.runner")

    log.info(
        "attempt running",
        extra={"job_id": "job_1", "attempt_id": "att_0190a1b2c3d4e5f6a7b8c9d0", "zone": "az1"},
    )
    log.warning("agent reported with %s", agent, extra={"team_id": "team_1"})
    log.warning("request headers %s", {"Authorization": f"Bearer {team_key}"})
    log.error("admin %s, key %s", admin, team_key, extra={"token": team_key})
    log.debug("below the level")

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 4
    first = lines[0]
    assert first["level"] == "INFO" and first["logger"] == "broker.services.runner"
    assert first["message"] == "attempt running"
    assert first["job_id"] == "job_1" and first["zone"] == "az1"
    assert first["attempt_id"] == "att_0190a1b2c3d4e5f6a7b8c9d0"  # an id is no secret
    assert first["time"].endswith("+00:00")
    assert lines[1]["message"] == "agent reported with att_[redacted]"
    assert lines[1]["team_id"] == "team_1"
    assert lines[2]["message"] == "request headers {'Authorization': '[redacted]'}"
    assert lines[3]["message"] == "admin [redacted], key brk_[redacted]"
    assert lines[3]["token"] == "[redacted]"
    text = stream.getvalue()
    assert admin not in text and team_key not in text and agent not in text


def test_text_logs_redact_too_and_show_extras(restore_logging):
    stream = io.StringIO()
    configure_logging(Settings(log_format="text"), level="INFO", stream=stream)
    token = "brk_" + "x" * 43
    logging.getLogger("broker.api").info("key %s", token, extra={"job_id": "job_9"})
    line = stream.getvalue().strip()
    assert line.endswith("INFO broker.api: key brk_[redacted] job_id=job_9")
    assert token not in line


def test_a_signing_header_logged_as_bytes_is_redacted_whole() -> None:
    from broker.logs import RedactSecrets

    line = (
        "Sending http request: headers {'Authorization': b'AWS4-HMAC-SHA256 "
        "Credential=AKIAEXAMPLE/20261203/us-east-1/ec2/aws4_request, SignedHeaders=host, "
        "Signature=0123456789abcdef'}"
    )
    redacted = RedactSecrets().redact(line)
    assert "Signature" not in redacted and "AKIAEXAMPLE" not in redacted
    assert "'Authorization': b'[redacted]'" in redacted
