"""Team routes: job submission, idempotency, listing, cancellation, budget and spend."""

from __future__ import annotations

from decimal import Decimal

from tests.helpers import job_spec, worst_case


def test_submit_reserves_the_plans_worst_case_and_queues(client, make_team):
    _, headers = make_team(limit="1000.00")
    quoted = client.post("/v1/quotes", json=job_spec(), headers=headers).json()["plans"][0]
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "queued"
    assert job["plan"] == quoted
    reserved = Decimal(quoted["worst_case_cost"])
    assert Decimal("0") < reserved <= Decimal("250.00")
    assert Decimal(job["reserved"]) == reserved
    assert job["spent"] == "0.00"
    assert job["progress"] == {
        "work_done": 0.0,
        "checkpointed_work": 0.0,
        "total_work": 40000.0,
        "fraction": 0.0,
    }
    budget = client.get("/v1/budget", headers=headers).json()
    assert Decimal(budget["reserved"]) == reserved
    assert Decimal(budget["available"]) == Decimal("1000.00") - reserved


def test_over_budget_submission_is_402_with_figures(client, make_team):
    _, headers = make_team(limit="0.50")
    needed = worst_case(client, headers, job_spec())
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert response.status_code == 402
    detail = response.json()["detail"]
    assert detail["code"] == "budget_exceeded"
    assert "0.50" in detail["message"] and needed.rstrip("0") in detail["message"]


def test_second_submission_over_budget_is_rejected(client, make_team, admin_headers):
    team, headers = make_team(limit="1000.00")
    limit = (Decimal(worst_case(client, headers, job_spec())) * Decimal("1.5")).quantize(
        Decimal("0.01")
    )
    client.patch(
        f"/v1/teams/{team['id']}", json={"budget": {"limit": str(limit)}}, headers=admin_headers
    )
    assert client.post("/v1/jobs", json=job_spec(), headers=headers).status_code == 201
    assert client.post("/v1/jobs", json=job_spec(), headers=headers).status_code == 402


def test_idempotency_key_returns_same_job(client, make_team):
    _, headers = make_team()
    keyed = {**headers, "Idempotency-Key": "run-42"}
    first = client.post("/v1/jobs", json=job_spec(), headers=keyed)
    again = client.post("/v1/jobs", json=job_spec(), headers=keyed)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    reserved = client.get("/v1/budget", headers=headers).json()["reserved"]
    assert reserved == first.json()["reserved"]


def test_idempotency_key_with_other_body_is_conflict(client, make_team):
    _, headers = make_team()
    keyed = {**headers, "Idempotency-Key": "run-43"}
    assert client.post("/v1/jobs", json=job_spec(), headers=keyed).status_code == 201
    other = client.post("/v1/jobs", json=job_spec(name="other"), headers=keyed)
    assert other.status_code == 409
    assert other.json()["detail"]["code"] == "conflict"


def test_bad_specs_name_the_field(client, make_team):
    _, headers = make_team()
    cases = [
        (job_spec(deadline="2026-12-05T12:00:00"), ["body", "deadline"]),
        (job_spec(deadline="2026-12-01T12:00:00Z"), ["body", "deadline"]),
        (job_spec(deadline="2028-12-01T12:00:00Z"), ["body", "deadline"]),
        (job_spec(max_cost=250.0), ["body", "max_cost"]),
        (job_spec(market="cheap"), ["body", "market"]),
        (job_spec(resources={"gpus": 0}), ["body", "resources", "gpus"]),
        (
            job_spec(resources={"gpus": 1, "providers": ["azure"]}),
            ["body", "resources", "providers", 0],
        ),
        (
            job_spec(workload={"model": "ResNet-50", "steps": -1}),
            ["body", "workload", "model", "steps"],
        ),
        (job_spec(extra=1), ["body", "extra"]),
        (job_spec(name="x" * 101), ["body", "name"]),
    ]
    for spec, loc in cases:
        response = client.post("/v1/jobs", json=spec, headers=headers)
        assert response.status_code == 422, (loc, response.text)
        assert response.json()["detail"][0]["loc"] == loc, response.text


def test_reference_gpu_hours_workload_is_accepted(client, make_team):
    _, headers = make_team()
    spec = job_spec(workload={"reference_gpu_hours": 40, "reference_gpu": "V100"})
    response = client.post("/v1/jobs", json=spec, headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["progress"]["total_work"] == 40.0


def test_list_jobs_paginates_newest_first(client, make_team):
    _, headers = make_team(limit="10000.00")
    ids = [
        client.post("/v1/jobs", json=job_spec(name=f"j{i}"), headers=headers).json()["id"]
        for i in range(5)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params, headers=headers).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_list_jobs_filters_by_status(client, make_team):
    _, headers = make_team(limit="10000.00")
    a = client.post("/v1/jobs", json=job_spec(name="a"), headers=headers).json()["id"]
    client.post("/v1/jobs", json=job_spec(name="b"), headers=headers)
    client.post(f"/v1/jobs/{a}/cancel", headers=headers)
    page = client.get("/v1/jobs", params={"status": "cancelled"}, headers=headers).json()
    assert [item["id"] for item in page["items"]] == [a]
    bad = client.get("/v1/jobs", params={"status": "sleeping"}, headers=headers)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "status"]
    bad_limit = client.get("/v1/jobs", params={"limit": 0}, headers=headers)
    assert bad_limit.status_code == 422


def test_cancel_releases_reservation_and_twice_is_conflict(client, make_team):
    _, headers = make_team(limit="1000.00")
    job = client.post("/v1/jobs", json=job_spec(), headers=headers).json()
    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["reserved"] == "0.00"
    assert client.get("/v1/budget", headers=headers).json()["available"] == "1000.00"
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
    assert again.status_code == 409
    assert again.json()["detail"]["code"] == "conflict"


def test_get_job_shows_spec_and_money(client, make_team):
    _, headers = make_team()
    job = client.post("/v1/jobs", json=job_spec(), headers=headers).json()
    shown = client.get(f"/v1/jobs/{job['id']}", headers=headers)
    assert shown.status_code == 200
    body = shown.json()
    assert body["spec"]["workload"]["model"] == "ResNet-50"
    assert body["max_cost"] == "250.00"
    assert body["deadline"] == "2026-12-05T12:00:00Z"
    assert body["attempts"] == [] and body["checkpoints"] == []


def test_spend_report_empty_and_bad_range(client, make_team):
    _, headers = make_team()
    response = client.get("/v1/spend", params={"group_by": "provider"}, headers=headers)
    assert response.status_code == 200
    assert response.json() == {"rows": [], "total": "0.00"}
    bad = client.get(
        "/v1/spend",
        params={"start": "2026-12-03T00:00:00Z", "end": "2026-12-02T00:00:00Z"},
        headers=headers,
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "end"]
    naive = client.get("/v1/spend", params={"start": "2026-12-03T00:00:00"}, headers=headers)
    assert naive.status_code == 422 and naive.json()["detail"][0]["loc"] == ["query", "start"]
    group = client.get("/v1/spend", params={"group_by": "week"}, headers=headers)
    assert group.status_code == 422


def test_body_over_limit_is_413(client, make_team):
    _, headers = make_team()
    huge = job_spec(name="x", resources={"gpus": 1, "regions": ["r" * 40] * 3000})
    response = client.post("/v1/jobs", json=huge, headers=headers)
    assert response.status_code == 413
