"""POST /v1/quotes over the bundled AWS and GCP catalog."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.helpers import job_spec, quote_spec


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


@pytest.mark.parametrize(
    "workload",
    [
        {"reference_gpu_hours": 1e-300},
        {"reference_gpu_hours": 0.009},
        {"model": "ResNet-50", "batch_size": 128, "steps": 1},
    ],
)
def test_a_job_too_small_to_run_is_refused_naming_the_workload(client, make_team, workload):
    _, team_key = make_team()
    response = client.post("/v1/quotes", json=job_spec(workload=workload), headers=team_key)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][-1] == "workload"
    assert "too small" in error["msg"] and "0.01 GPU-hours" in error["msg"]
    submitted = client.post("/v1/jobs", json=job_spec(workload=workload), headers=team_key)
    assert submitted.status_code == 422


def test_the_smallest_job_is_admitted(client, make_team):
    _, team_key = make_team()
    spec = job_spec(workload={"reference_gpu_hours": 0.01}, max_cost="5.00")
    assert client.post("/v1/jobs", json=spec, headers=team_key).status_code == 201


def test_a_quote_for_32_gpus_returns_gangs_of_4_machines_of_8_each_in_one_zone(client, make_team):
    _, headers = make_team()
    spec = quote_spec(resources={"gpus": 32, "gpu_types": ["H100"]}, max_cost="5000.00")
    response = client.post("/v1/quotes", json=spec, headers=headers)
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    costs = [Decimal(p["expected_cost"]) for p in plans]
    assert costs and costs == sorted(costs)
    listed = client.get(
        "/v1/prices", params={"gpu": "H100", "limit": 1000}, headers=headers
    ).json()["items"]
    price = {
        (r["zone"], r["instance_type"], r["market"]): Decimal(r["price_per_hour"]) for r in listed
    }
    for p in plans:
        assert (p["nodes"], p["gpu_count"], p["total_gpus"]) == (4, 8, 32)
        # One offer of the catalog (an instance type in one zone), four of it.
        each = price[(p["zone"], p["instance_type"], p["market"])]
        assert Decimal(p["price_per_hour"]) == 4 * each


def test_nodes_given_make_gpus_per_machine(client, make_team):
    _, headers = make_team()
    spec = quote_spec(resources={"gpus": 8, "nodes": 2, "gpu_types": ["A100"]}, max_cost="900.00")
    body = client.post("/v1/quotes", json=spec, headers=headers).json()
    assert body["plans"]
    for p in body["plans"] + [body["cheapest_on_demand"]]:
        assert (p["nodes"], p["gpu_count"], p["total_gpus"], p["gpu"]) == (2, 8, 16, "A100")
    single = quote_spec(resources={"gpus": 8, "nodes": 1, "gpu_types": ["A100"]})
    for p in client.post("/v1/quotes", json=single, headers=headers).json()["plans"]:
        assert (p["nodes"], p["total_gpus"]) == (1, 8)


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"gpus": 16, "nodes": 16}, "nodes"),  # 256 GPUs in all
        ({"gpus": 8, "nodes": 0}, "nodes"),
        ({"gpus": 8, "nodes": 17}, "nodes"),
        ({"gpus": 129}, "gpus"),
        ({"gpus": 8, "nodes": 2.5}, "nodes"),
    ],
)
def test_a_nonsense_gang_is_422_naming_the_field(client, make_team, resources, field):
    _, headers = make_team()
    response = client.post("/v1/quotes", json=quote_spec(resources=resources), headers=headers)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "resources", field]


def test_gpus_no_split_can_serve_is_infeasible_and_says_how_gangs_form(client, make_team):
    _, headers = make_team()
    spec = quote_spec(resources={"gpus": 34, "gpu_types": ["H100"]})
    response = client.post("/v1/quotes", json=spec, headers=headers)
    assert response.status_code == 422
    message = response.json()["detail"]["message"]
    assert "gpus=34" in message and "N identical machines" in message
