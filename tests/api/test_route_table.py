"""Walks the app's route table: every route needs a token and keeps teams apart.

A new route without an entry in ISOLATION fails ``test_every_route_has_an_isolation_case``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import job_spec

PUBLIC = {("GET", "/healthz"), ("GET", "/metrics")}


def _routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    paths = app.openapi()["paths"]
    return sorted((method.upper(), path) for path, ops in paths.items() for method in ops)


def _fill(path: str) -> str:
    return (
        path.replace("{team_id}", "team_x")
        .replace("{key_id}", "key_x")
        .replace("{job_id}", "job_x")
        .replace("{attempt_id}", "att_x")
    )


def test_every_route_needs_a_valid_token(app, client):
    for method, path in _routes(app):
        if (method, path) in PUBLIC:
            continue
        for headers in (
            {},
            {"Authorization": "Bearer brk_not-a-key"},
            {"Authorization": "Basic abc"},
        ):
            response = client.request(method, _fill(path), headers=headers, json={})
            assert response.status_code == 401, (method, path, headers, response.text)


# Each case: given the client, team A's headers, team B's (team json, headers) and the admin
# headers, make team B own something and show that team A cannot reach it.
Case = Callable[..., None]


def _b_job(client, b_headers) -> str:  # type: ignore[no-untyped-def]
    response = client.post("/v1/jobs", json=job_spec(), headers=b_headers)
    assert response.status_code == 201
    return response.json()["id"]


def _get_job(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    assert client.get(f"/v1/jobs/{_b_job(client, b_headers)}", headers=a).status_code == 404


def _cancel_job(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    job_id = _b_job(client, b_headers)
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=a).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=b_headers).json()["status"] == "queued"


def _list_jobs(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    _b_job(client, b_headers)
    assert client.get("/v1/jobs", headers=a).json()["items"] == []


def _submit_job(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    # A's submission spends A's budget, never B's.
    client.post("/v1/jobs", json=job_spec(), headers=a)
    assert client.get("/v1/budget", headers=b_headers).json()["reserved"] == "0.00"


def _budget(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    _b_job(client, b_headers)
    assert client.get("/v1/budget", headers=a).json()["reserved"] == "0.00"


def _spend(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    _b_job(client, b_headers)
    assert client.get("/v1/spend", params={"group_by": "job"}, headers=a).json()["rows"] == []


def _logs(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    job_id = _b_job(client, b_headers)
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=a).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/logs?follow=true", headers=a).status_code == 404


def _workdirs(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    # An upload lands in the caller's own folder (tests/api/test_workdirs.py); a job of A's
    # cannot name an object in B's.
    from broker.settings import get_settings

    theirs = f"s3://{get_settings().checkpoint_bucket}/workdirs/{b['id']}/{'0' * 64}.tar.gz"
    spec = job_spec(run={"command": "python train.py", "workdir": theirs})
    response = client.post("/v1/jobs", json=spec, headers=a)
    assert response.status_code == 422 and "run.workdir" in response.text
    bad = client.post("/v1/workdirs", content=b"not a tar.gz", headers=a)
    assert bad.status_code == 422


def _admin_only(method: str, path: str) -> Case:
    def case(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
        url = path.replace("{team_id}", b["id"]).replace("{key_id}", "key_x")
        assert client.request(method, url, headers=a, json={"name": "x"}).status_code == 403

    return case


def _quote(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    response = client.post("/v1/quotes", json=job_spec(), headers=a)
    assert response.status_code in (200, 422)
    assert client.get("/v1/budget", headers=b_headers).json()["reserved"] == "0.00"


def _prices(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    # Market prices are the same for every team; listing them touches no team's budget.
    _b_job(client, b_headers)
    reserved = client.get("/v1/budget", headers=b_headers).json()["reserved"]
    assert client.get("/v1/prices", headers=a).status_code == 200
    assert client.get("/v1/budget", headers=b_headers).json()["reserved"] == reserved
    assert client.get("/v1/budget", headers=a).json()["reserved"] == "0.00"


def _progress(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
    # An attempt token of team B's job is the only thing that can report its progress.
    response = client.post("/v1/attempts/att_x/progress", json={"work_done": 1}, headers=a)
    assert response.status_code in (401, 404)


def _agent_route(method: str, path: str, **request: object) -> Case:
    # Agent routes take an attempt token only: a team key reaches no attempt's run spec,
    # logs, checkpoints or exit (tests/api/test_agent_routes.py: one attempt's token no other).
    def case(client, a, b, b_headers, admin):  # type: ignore[no-untyped-def]
        url = _fill(path)
        response = client.request(method, url, headers=a, **request)  # type: ignore[arg-type]
        assert response.status_code in (401, 404), (method, path, response.text)

    return case


ISOLATION: dict[tuple[str, str], Case] = {
    ("GET", "/v1/jobs/{job_id}"): _get_job,
    ("POST", "/v1/jobs/{job_id}/cancel"): _cancel_job,
    ("GET", "/v1/jobs"): _list_jobs,
    ("POST", "/v1/jobs"): _submit_job,
    ("GET", "/v1/budget"): _budget,
    ("GET", "/v1/spend"): _spend,
    ("POST", "/v1/quotes"): _quote,
    ("GET", "/v1/prices"): _prices,
    ("GET", "/v1/jobs/{job_id}/logs"): _logs,
    ("POST", "/v1/workdirs"): _workdirs,
    ("POST", "/v1/attempts/{attempt_id}/progress"): _progress,
    ("GET", "/v1/attempts/{attempt_id}/run"): _agent_route("GET", "/v1/attempts/{attempt_id}/run"),
    ("POST", "/v1/attempts/{attempt_id}/checkpoints"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/checkpoints", json={"work_done": 1}
    ),
    ("POST", "/v1/attempts/{attempt_id}/logs"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/logs", content=b"x"
    ),
    ("POST", "/v1/attempts/{attempt_id}/exit"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/exit", json={"exit_code": 0, "tail": ""}
    ),
    ("POST", "/v1/attempts/{attempt_id}/preempted"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/preempted", json={"reason": "x"}
    ),
    ("POST", "/v1/attempts/{attempt_id}/lapsed"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/lapsed", json={}
    ),
    ("POST", "/v1/attempts/{attempt_id}/rendezvous"): _agent_route(
        "POST", "/v1/attempts/{attempt_id}/rendezvous", json={"addr": "10.0.0.1", "port": 1}
    ),
    ("GET", "/v1/agent"): _agent_route("GET", "/v1/agent", params={"attempt": "att_x"}),
    ("GET", "/v1/agent/sdk"): _agent_route("GET", "/v1/agent/sdk", params={"attempt": "att_x"}),
    **{
        (m, p): _admin_only(m, p)
        for m, p in [
            ("GET", "/v1/teams"),
            ("POST", "/v1/teams"),
            ("GET", "/v1/teams/{team_id}"),
            ("PATCH", "/v1/teams/{team_id}"),
            ("POST", "/v1/teams/{team_id}/keys"),
            ("DELETE", "/v1/teams/{team_id}/keys/{key_id}"),
        ]
    },
}


def test_every_route_has_an_isolation_case(app):
    missing = [r for r in _routes(app) if r not in PUBLIC and r not in ISOLATION]
    assert missing == [], f"routes without an isolation test: {missing}"


@pytest.mark.parametrize("route", sorted(ISOLATION), ids=lambda r: f"{r[0]} {r[1]}")
def test_team_cannot_reach_other_teams_resources(route, app, client, make_team, admin_headers):
    if route not in _routes(app):
        pytest.skip(f"{route} is not served yet")
    _, a_headers = make_team(limit="1000.00")
    b_team, b_headers = make_team(limit="1000.00")
    ISOLATION[route](client, a_headers, b_team, b_headers, admin_headers)


def test_every_route_gives_back_its_connection_before_its_response_waits_for_a_thread(app):
    """Every router is built with ``route_class=SessionRoute`` (``broker/api/deps.py``); a
    sync endpoint left out would hold a read's connection while its response waits for a
    thread (``tests/api/test_pool_starvation.py``)."""
    from fastapi.routing import APIRoute

    from broker.api.deps import SessionRoute

    def walk(routes):  # type: ignore[no-untyped-def]
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI's included router
            yield from walk(included.routes) if included is not None else [route]

    routes = [route for route in walk(app.routes) if isinstance(route, APIRoute)]
    assert len(routes) >= len(_routes(app))
    assert [r.path for r in routes if not isinstance(r, SessionRoute)] == []
