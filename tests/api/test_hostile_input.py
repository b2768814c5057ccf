"""Hostile input gets a 4xx that names what is wrong, never a 500 or a traceback.

Extends tests/api/test_jobs.py (past and far deadlines of a submission, a float
max_cost, gpus 0, negative steps, an unknown top-level field, a 101-character job name) and
tests/api/test_teams.py (a float or negative budget, an unknown team field). Each
regression test below names the bug schemathesis or a hand-made hostile case found.
"""

from __future__ import annotations

import json

import pytest

from broker.settings import get_settings
from tests.helpers import job_spec

JSON = {"content-type": "application/json"}


def assert_no_traceback(response) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in response.text and 'File "' not in response.text, response.text


def assert_field_error(response, loc: list) -> None:  # type: ignore[no-untyped-def]
    """A 422 in FastAPI's validation shape whose first error is at ``loc``."""
    assert response.status_code == 422, response.text
    assert_no_traceback(response)
    assert response.json()["detail"][0]["loc"] == loc, response.text


@pytest.fixture
def team_headers(make_team) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return make_team()[1]


# -- body size -------------------------------------------------------------------------


def test_body_over_the_limit_is_413_too_large(client, team_headers):
    limit = get_settings().max_body_bytes
    body = json.dumps(job_spec(name="x" * (limit + 1)))
    response = client.post("/v1/jobs", content=body, headers={**team_headers, **JSON})
    assert response.status_code == 413
    assert response.json()["detail"]["code"] == "too_large"
    assert str(limit) in response.json()["detail"]["message"]
    assert_no_traceback(response)


def test_chunked_body_over_the_limit_is_413(client, team_headers):
    """No Content-Length to trust: the limit counts the bytes as they arrive."""
    limit = get_settings().max_body_bytes

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(limit // 1024 + 2):
            yield b" " * 1024

    response = client.post("/v1/quotes", content=chunks(), headers={**team_headers, **JSON})
    assert response.status_code == 413
    assert response.json()["detail"]["code"] == "too_large"


def test_body_at_the_limit_is_read(client, team_headers):
    body = json.dumps(job_spec()).encode()
    padded = body + b" " * (get_settings().max_body_bytes - len(body))
    response = client.post("/v1/quotes", content=padded, headers={**team_headers, **JSON})
    assert response.status_code == 200, response.text


# -- string lengths --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/v1/teams", {"name": "t" * 101, "budget": {"limit": "1"}}, ["body", "name"]),
        ("/v1/teams", {"name": "", "budget": {"limit": "1"}}, ["body", "name"]),
    ],
)
def test_over_long_or_empty_team_name_is_422(client, admin_headers, path, body, loc):
    assert_field_error(client.post(path, json=body, headers=admin_headers), loc)


def test_over_long_key_name_is_422(client, admin_headers, make_team):
    team, _ = make_team()
    response = client.post(
        f"/v1/teams/{team['id']}/keys", json={"name": "k" * 101}, headers=admin_headers
    )
    assert_field_error(response, ["body", "name"])


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"workload": {"model": "m" * 41, "steps": 1}}, ["body", "workload", "model", "model"]),
        (
            {"resources": {"gpus": 1, "gpu_types": ["g" * 41]}},
            ["body", "resources", "gpu_types", 0],
        ),
        ({"resources": {"gpus": 1, "regions": ["r"] * 101}}, ["body", "resources", "regions"]),
    ],
)
def test_over_long_strings_and_lists_in_a_spec_are_422(client, team_headers, overrides, loc):
    response = client.post("/v1/quotes", json=job_spec(**overrides), headers=team_headers)
    assert_field_error(response, loc)


def test_over_long_idempotency_key_is_422(client, team_headers):
    headers = {**team_headers, "Idempotency-Key": "k" * 201}
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert_field_error(response, ["header", "Idempotency-Key"])


def test_over_long_path_id_is_422_not_a_lookup(client, team_headers):
    response = client.get("/v1/jobs/" + "j" * 65, headers=team_headers)
    assert_field_error(response, ["path", "job_id"])


# -- numeric ranges --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"resources": {"gpus": 129}}, ["body", "resources", "gpus"]),  # 128 in all at most
        ({"resources": {"gpus": 10**30}}, ["body", "resources", "gpus"]),
        ({"resources": {"gpus": -1}}, ["body", "resources", "gpus"]),
        (
            {"resources": {"gpus": 1, "min_gpu_memory_gb": -1}},
            ["body", "resources", "min_gpu_memory_gb"],
        ),
        ({"resources": {"gpus": 1, "vcpus_per_gpu": 1e9}}, ["body", "resources", "vcpus_per_gpu"]),
        (
            {"workload": {"model": "ResNet-50", "steps": 10**13}},
            ["body", "workload", "model", "steps"],
        ),
        (
            {"workload": {"model": "ResNet-50", "batch_size": 0, "steps": 1}},
            ["body", "workload", "model", "batch_size"],
        ),
        (
            {"workload": {"reference_gpu_hours": 0}},
            ["body", "workload", "reference", "reference_gpu_hours"],
        ),
        (
            {"workload": {"reference_gpu_hours": 2e6}},
            ["body", "workload", "reference", "reference_gpu_hours"],
        ),
        ({"checkpoint": {"interval_minutes": 0}}, ["body", "checkpoint", "interval_minutes"]),
        ({"checkpoint": {"size_gb": -5}}, ["body", "checkpoint", "size_gb"]),
        ({"priority": 101}, ["body", "priority"]),
        ({"max_cost": "-0.01"}, ["body", "max_cost"]),
        ({"max_cost": "10000000.01"}, ["body", "max_cost"]),
        ({"max_cost": "0.0000001"}, ["body", "max_cost"]),
    ],
)
def test_negative_and_huge_numbers_in_a_spec_are_422(client, team_headers, overrides, loc):
    response = client.post("/v1/jobs", json=job_spec(**overrides), headers=team_headers)
    assert_field_error(response, loc)


@pytest.mark.parametrize("alert_at", [-0.1, 1.5])
def test_alert_threshold_outside_zero_to_one_is_422(client, admin_headers, alert_at):
    body = {"name": "t", "budget": {"limit": "1", "alert_at": alert_at}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert_field_error(response, ["body", "budget", "alert_at"])


def test_budget_limit_over_ten_million_is_422(client, admin_headers):
    body = {"name": "t", "budget": {"limit": "10000001"}}
    response = client.post("/v1/teams", json=body, headers=admin_headers)
    assert_field_error(response, ["body", "budget", "limit"])


@pytest.mark.parametrize("work_done", [-1, 1e16])
def test_progress_out_of_range_is_422(client, work_done):
    response = client.post(
        "/v1/attempts/att_x/progress",
        json={"work_done": work_done},
        headers={"Authorization": "Bearer att_x"},
    )
    assert_field_error(response, ["body", "work_done"])


@pytest.mark.parametrize("limit", [101, 10**30, -1])
def test_page_size_out_of_range_is_422(client, team_headers, limit):
    response = client.get("/v1/jobs", params={"limit": limit}, headers=team_headers)
    assert_field_error(response, ["query", "limit"])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_422_not_500(client, team_headers, literal):
    """Regression: Python's JSON parser accepts NaN and Infinity; echoing them back in the
    validation error could not be encoded and gave a 500."""
    spec = job_spec(checkpoint={"interval_minutes": 30, "size_gb": "__X__"})
    body = json.dumps(spec).replace('"__X__"', literal)
    response = client.post("/v1/quotes", content=body, headers={**team_headers, **JSON})
    assert_field_error(response, ["body", "checkpoint", "size_gb"])
    assert isinstance(response.json()["detail"][0]["input"], str)


def test_nan_progress_is_422_not_500(client):
    response = client.post(
        "/v1/attempts/att_x/progress",
        content='{"work_done": NaN}',
        headers={"Authorization": "Bearer att_x", **JSON},
    )
    assert_field_error(response, ["body", "work_done"])


# -- deadlines and times ---------------------------------------------------------------


@pytest.mark.parametrize("deadline", ["2026-12-01T12:00:00Z", "2026-12-03T12:00:00Z"])
def test_quote_with_deadline_not_in_the_future_is_422(client, team_headers, deadline):
    response = client.post("/v1/quotes", json=job_spec(deadline=deadline), headers=team_headers)
    assert_field_error(response, ["body", "deadline"])


def test_quote_with_deadline_more_than_a_year_ahead_is_422(client, team_headers):
    """Regression: quotes only refused past deadlines; submissions refused both."""
    spec = job_spec(deadline="2027-12-03T12:00:01Z")
    response = client.post("/v1/quotes", json=spec, headers=team_headers)
    assert_field_error(response, ["body", "deadline"])
    assert "year" in response.json()["detail"][0]["msg"]


def test_deadline_exactly_a_year_ahead_is_accepted(client, team_headers):
    spec = job_spec(deadline="2027-12-03T12:00:00Z")
    assert client.post("/v1/quotes", json=spec, headers=team_headers).status_code == 200


@pytest.mark.parametrize(
    "deadline", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "not a time"]
)
def test_deadline_outside_the_calendar_is_422(client, team_headers, deadline):
    for path in ("/v1/quotes", "/v1/jobs"):
        response = client.post(path, json=job_spec(deadline=deadline), headers=team_headers)
        assert_field_error(response, ["body", "deadline"])


@pytest.mark.parametrize("name", ["start", "end"])
def test_spend_range_outside_the_calendar_is_422_not_500(client, team_headers, name):
    """Regression: a time whose offset pushes it past year 9999 in UTC crashed the query."""
    params = {name: "9999-12-31T23:59:59-23:59"}
    response = client.get("/v1/spend", params=params, headers=team_headers)
    assert_field_error(response, ["query", name])


# -- unknown fields --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"resources": {"gpus": 1, "tpus": 8}}, ["body", "resources", "tpus"]),
        (
            {"workload": {"model": "ResNet-50", "steps": 1, "epochs": 2}},
            ["body", "workload", "model", "epochs"],
        ),
        (
            {"workload": {"reference_gpu_hours": 4, "speedup": 2}},
            ["body", "workload", "reference", "speedup"],
        ),
        ({"checkpoint": {"interval_minutes": 30, "every": 1}}, ["body", "checkpoint", "every"]),
    ],
)
def test_unknown_nested_field_in_a_spec_is_422_naming_it(client, team_headers, overrides, loc):
    response = client.post("/v1/jobs", json=job_spec(**overrides), headers=team_headers)
    assert_field_error(response, loc)


def test_unknown_field_in_progress_is_422_naming_it(client):
    response = client.post(
        "/v1/attempts/att_x/progress",
        json={"work_done": 1, "done": True},
        headers={"Authorization": "Bearer att_x"},
    )
    assert_field_error(response, ["body", "done"])


# -- bodies that are not JSON ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe\xfd{", b'{"name": "\xe9"}', b"[" * 20_000 + b"]" * 20_000],
    ids=["not-utf8", "latin1-in-json", "nested-too-deeply"],
)
def test_undecodable_body_is_422_not_400(client, team_headers, body):
    """Regression: FastAPI answered 400 with a bare string detail (neither documented nor
    API.md's validation shape) when the body could not be decoded at all."""
    response = client.post("/v1/quotes", content=body, headers={**team_headers, **JSON})
    assert response.status_code == 422, response.text
    assert_no_traceback(response)
    assert response.json()["detail"][0]["loc"][0] == "body"
    assert response.json()["detail"][0]["type"] == "json_invalid"


# -- control characters (PostgreSQL refuses NUL: these were 500s there) ----------------


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        (
            {"workload": {"model": "ResNet-50\x00", "steps": 1}},
            ["body", "workload", "model", "model"],
        ),
        ({"resources": {"gpus": 1, "regions": ["us\x00"]}}, ["body", "resources", "regions", 0]),
    ],
)
def test_nul_in_a_spec_string_is_422(client, team_headers, overrides, loc):
    response = client.post("/v1/jobs", json=job_spec(**overrides), headers=team_headers)
    assert_field_error(response, loc)


@pytest.mark.parametrize(
    ("path", "loc"),
    [
        ("/v1/jobs/job%00x", ["path", "job_id"]),
        ("/v1/jobs/job%00x/cancel", ["path", "job_id"]),
        ("/v1/jobs?cursor=%00", ["query", "cursor"]),
    ],
)
def test_nul_in_an_id_or_cursor_is_422(client, team_headers, path, loc):
    method = "POST" if path.endswith("/cancel") else "GET"
    assert_field_error(client.request(method, path, headers=team_headers), loc)


def test_nul_in_admin_path_ids_is_422(client, admin_headers, make_team):
    team, _ = make_team()
    assert_field_error(client.get("/v1/teams/%00", headers=admin_headers), ["path", "team_id"])
    response = client.delete(f"/v1/teams/{team['id']}/keys/%00", headers=admin_headers)
    assert_field_error(response, ["path", "key_id"])


def test_nul_in_idempotency_key_is_422(client, team_headers):
    headers = {**team_headers, "Idempotency-Key": "run\x00"}
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert_field_error(response, ["header", "Idempotency-Key"])


def test_nul_in_checkpoint_key_is_422(client):
    response = client.post(
        "/v1/attempts/att_x/progress",
        json={"work_done": 1, "checkpoint_key": "ckpt\x00"},
        headers={"Authorization": "Bearer att_x"},
    )
    assert_field_error(response, ["body", "checkpoint_key"])


# -- the agent route without its token -------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "status"),
    [(None, 401), ("Bearer brk_team-key", 401), ("Basic att_x", 401), ("Bearer att_x", 404)],
)
def test_progress_without_a_valid_attempt_token_is_401_or_404(client, authorization, status):
    headers = {"Authorization": authorization} if authorization else {}
    response = client.post("/v1/attempts/att_x/progress", json={"work_done": 1}, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["detail"]["code"] in {"unauthorized", "not_found"}


# -- the schema documents the errors ---------------------------------------------------


def test_openapi_documents_every_error_a_route_returns(app):
    """Regression: only 200 and 422 were declared, so every 401/403/404/409/402/413 body
    was undocumented."""
    schema = app.openapi()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if path.startswith("/v1/"):
                assert "401" in codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if "requestBody" in operation:
                assert "413" in codes, (method, path)
    submit = schema["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"402", "409"} <= set(submit)
    refs = [s["$ref"] for s in submit["422"]["content"]["application/json"]["schema"]["anyOf"]]
    assert refs == ["#/components/schemas/ValidationErrorBody", "#/components/schemas/ErrorBody"]


def test_openapi_money_is_a_decimal_string(app):
    """Regression: Money was documented as "number or any string" with its bounds leaked
    as unknown keywords ("le": "10000000"), though a JSON number is refused."""
    money = app.openapi()["components"]["schemas"]["JobSpec"]["properties"]["max_cost"]
    kinds = {branch["type"] for branch in money["anyOf"]}
    assert kinds == {"string", "integer"}
    assert not {"le", "ge", "max_digits", "decimal_places"} & set(money)
