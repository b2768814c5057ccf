"""POST /v1/quotes over the bundled AWS and GCP catalog."""

from __future__ import annotations

from decimal import Decimal

from tests.helpers import job_spec


def test_quote_ranks_plans_by_expected_cost_and_launches_nothing(client, make_team):
    _, headers = make_team()
    response = client.post("/v1/quotes", json=job_spec(), headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    costs = [Decimal(p["expected_cost"]) for p in body["plans"]]
    assert costs and costs == sorted(costs)
    for plan in body["plans"]:
        assert plan["gpu"] in ("V100", "A100") and plan["gpu_count"] == 1
        assert Decimal(plan["worst_case_cost"]) <= Decimal("250.00")
    assert body["cheapest_on_demand"]["market"] == "on_demand"
    assert client.get("/v1/budget", headers=headers).json()["reserved"] == "0.00"
    assert client.get("/v1/jobs", headers=headers).json()["items"] == []


def test_cheapest_plan_beats_on_demand_with_spot(client, make_team):
    _, headers = make_team()
    body = client.post("/v1/quotes", json=job_spec(resources={"gpus": 1}), headers=headers).json()
    best = body["plans"][0]
    assert Decimal(best["expected_cost"]) < Decimal(body["cheapest_on_demand"]["expected_cost"])


def test_infeasible_quote_says_why(client, make_team):
    _, headers = make_team()
    response = client.post("/v1/quotes", json=job_spec(max_cost="0.01"), headers=headers)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail["code"] == "infeasible" and detail["message"]


def test_unknown_model_is_422_naming_workload(client, make_team):
    _, headers = make_team()
    spec = job_spec(workload={"model": "GPT-9", "steps": 10})
    response = client.post("/v1/quotes", json=spec, headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "workload"]
    assert "known models" in response.json()["detail"][0]["msg"]
