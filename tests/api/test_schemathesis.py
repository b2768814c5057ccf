"""Hostile input: schemathesis fuzzes every operation of /openapi.json in-process (ASGI).

Every response must be a non-5xx that the schema documents (status code, content type,
body). Admin routes get the admin token, team routes a team key, the agent route a
well-formed but unknown attempt token (so cases reach the attempt lookup: 401 or 404).
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import ASGIClient
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from broker.api import create_app
from broker.settings import get_settings
from tests.helpers import job_spec

BASE_URL = "http://testserver"
# Fuzzing examples per operation; the coverage and explicit-examples phases add their own
# deterministic cases on top (about 1,650 calls in all with 60). The last test of this
# module asserts at least MIN_TOTAL_CASES.
EXAMPLES_PER_OPERATION = 60
MIN_TOTAL_CASES = 1000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# Inside the conftest clock's window (not past, within a year), so that generated specs
# with it reach planning and admission instead of stopping at the deadline check.
ON_TIME = "2026-12-05T12:00:00Z"

# POST /v1/workdirs takes a tar.gz: its fuzzed bodies go as the raw bytes they are.
schemathesis.serializer.alias("application/gzip", "application/octet-stream")
# The schema is the app's own; requests go to each test's app (on the test database).
schema = schemathesis.openapi.from_dict(create_app().openapi())
calls: Counter[str] = Counter()
unauthenticated: Counter[int] = Counter()


@pytest.fixture
def asgi(app, monkeypatch) -> ASGIClient:  # type: ignore[no-untyped-def]
    """A requests session that reaches the test's app in-process."""
    # A followed log streams until its job has finished: a fuzzed follow ends at once.
    monkeypatch.setattr(get_settings(), "log_follow_seconds", 0.01)
    return ASGIClient(app, base_url=BASE_URL)


@pytest.fixture
def principals(make_team, admin_headers) -> dict[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    """The headers each kind of caller sends."""
    _, team_headers = make_team(name="fuzz", limit="1000000.00")
    return {
        "admin": admin_headers,
        "agent": {"Authorization": "Bearer att_unknown"},
        "ops": {},
        "team": team_headers,
    }


@pytest.fixture
def known_ids(client, make_team, admin_headers, principals) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Ids that exist: an admin-managed team and its key, a job of the fuzzing team."""
    team, _ = make_team(name="target")
    key = client.post(f"/v1/teams/{team['id']}/keys", json={"name": "x"}, headers=admin_headers)
    job = client.post("/v1/jobs", json=job_spec(), headers=principals["team"])
    assert key.status_code == 201 and job.status_code == 201, (key.text, job.text)
    return {"team_id": team["id"], "key_id": key.json()["id"], "job_id": job.json()["id"]}


def _principal(case: schemathesis.Case) -> str:
    tag = (case.operation.tags or ["ops"])[0]
    return tag if tag in {"admin", "agent", "ops"} else "team"


def _aim(case: schemathesis.Case, known_ids: dict[str, str]) -> None:
    """Every other case: real ids in the path and an on-time deadline, so that generated
    input also reaches the success paths (whose bodies are checked against the schema)."""
    if calls[case.operation.label] % 2:
        return
    for name, value in known_ids.items():
        if case.path_parameters and name in case.path_parameters:
            case.path_parameters[name] = value
    if isinstance(case.body, dict) and "deadline" in case.body:
        case.body["deadline"] = ON_TIME


@schema.parametrize()
@FUZZ
def test_every_operation_survives_generated_input(case, asgi, principals, known_ids) -> None:  # type: ignore[no-untyped-def]
    calls[case.operation.label] += 1
    _aim(case, known_ids)
    headers = principals[_principal(case)]
    case.call_and_validate(base_url=BASE_URL, session=asgi, headers=headers, checks=CHECKS)


@schema.parametrize()
@settings(FUZZ, max_examples=5)
def test_unauthenticated_requests_get_documented_errors(case, asgi) -> None:  # type: ignore[no-untyped-def]
    response = case.call_and_validate(base_url=BASE_URL, session=asgi, checks=CHECKS)
    unauthenticated[response.status_code] += 1
    if case.operation.path.startswith("/v1/"):
        # 405: the coverage phase also tries methods the path does not have.
        assert response.status_code in {401, 404, 405, 413, 422}, response.text


def test_at_least_a_thousand_cases_were_generated() -> None:
    if not calls:
        pytest.skip("runs after test_every_operation_survives_generated_input")
    assert sum(calls.values()) >= MIN_TOTAL_CASES, calls
    assert unauthenticated[401] > 0, unauthenticated
