"""Team routes: job submission, idempotency, listing, cancellation, budget and spend."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.helpers import RUN, job_spec, quote_spec, reservation


def test_submit_reserves_what_its_policy_may_spend_and_queues(client, make_team):
    _, headers = make_team(limit="1000.00")
    quote = client.post("/v1/quotes", json=job_spec(), headers=headers).json()
    quoted = quote["plans"][0]
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "queued"
    assert job["plan"] == quoted
    # on-demand for all the work at least, within 1.5 x the on-demand-only cost
    reserved = Decimal(job["reserved"])
    on_demand = Decimal(quote["cheapest_on_demand"]["expected_cost"])
    assert on_demand < reserved <= Decimal("1.5") * on_demand
    assert reserved <= min(Decimal(quoted["worst_case_cost"]), Decimal("250.00"))
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
    needed = reservation(client, make_team, job_spec())
    response = client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert response.status_code == 402
    detail = response.json()["detail"]
    assert detail["code"] == "budget_exceeded"
    assert "0.50" in detail["message"] and needed.rstrip("0") in detail["message"]


def test_second_submission_over_budget_is_rejected(client, make_team, admin_headers):
    team, headers = make_team(limit="1000.00")
    limit = (Decimal(reservation(client, make_team, job_spec())) * Decimal("1.5")).quantize(
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


DIGEST = "sha256:" + "0123456789abcdef" * 4


def run(**fields: object) -> dict:
    return {**RUN, **fields}


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"run": {}}, ["body", "run", "command"]),
        ({"run": run(command="")}, ["body", "run", "command"]),
        ({"run": run(command="   ")}, ["body", "run", "command"]),
        ({"run": run(command="x" * 10_001)}, ["body", "run", "command"]),
        ({"run": run(command="python\x00train.py")}, ["body", "run", "command"]),
        ({"run": run(setup="s" * 16_385)}, ["body", "run", "setup"]),
        ({"run": run(setup="pip install\x00")}, ["body", "run", "setup"]),
        ({"run": run(image="PyTorch/PyTorch")}, ["body", "run", "image"]),
        ({"run": run(image="pytorch:")}, ["body", "run", "image"]),
        ({"run": run(image="pytorch pytorch")}, ["body", "run", "image"]),
        ({"run": run(image="pytorch@sha256:123")}, ["body", "run", "image"]),
        ({"run": run(image="pytorch/pytorch\n")}, ["body", "run", "image"]),
        ({"run": run(image="a" * 256)}, ["body", "run", "image"]),
        ({"run": run(env={"1ST": "x"})}, ["body", "run", "env", "1ST", "[key]"]),
        ({"run": run(env={"A-B": "x"})}, ["body", "run", "env", "A-B", "[key]"]),
        (
            {"run": run(env={"BROKER_JOB_ID": "x"})},
            ["body", "run", "env", "BROKER_JOB_ID", "[key]"],
        ),
        ({"run": run(env={"A": "x" * 4097})}, ["body", "run", "env", "A"]),
        ({"run": run(env={"A": "x\x00"})}, ["body", "run", "env", "A"]),
        ({"run": run(env={"A": 1})}, ["body", "run", "env", "A"]),
        ({"run": run(env={f"V{i}": "x" for i in range(65)})}, ["body", "run", "env"]),
        ({"run": run(workdir="http://example.com/w.tar.gz")}, ["body", "run", "workdir"]),
        ({"run": run(workdir="file:///home/me/w.tar.gz")}, ["body", "run", "workdir"]),
        ({"run": run(workdir="s3://Bucket/w.tar.gz")}, ["body", "run", "workdir"]),
        ({"run": run(workdir="s3://bucket")}, ["body", "run", "workdir"]),
        ({"run": run(workdir="https://example.com/a b")}, ["body", "run", "workdir"]),
        ({"run": run(workdir="s3://bucket/k\x00")}, ["body", "run", "workdir"]),
        ({"run": run(extra=1)}, ["body", "run", "extra"]),
        ({"max_restarts_on_errors": -1}, ["body", "max_restarts_on_errors"]),
        ({"max_restarts_on_errors": 11}, ["body", "max_restarts_on_errors"]),
        ({"max_restarts_on_errors": "two"}, ["body", "max_restarts_on_errors"]),
    ],
)
def test_bad_run_blocks_name_the_field(client, make_team, overrides, loc):
    _, headers = make_team()
    response = client.post("/v1/jobs", json=job_spec(**overrides), headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc, response.text


def test_a_full_run_block_is_stored_with_the_job(client, make_team):
    _, headers = make_team()
    block = {
        "command": "python train.py --epochs 90",
        "setup": "pip install -r requirements.txt\necho ready",
        "image": f"registry.example.com:5000/team/trainer:2.5.1-cuda12.4@{DIGEST}",
        "env": {"WANDB_MODE": "offline", "_x1": "", "broker_lower": "allowed"},
        "workdir": "https://example.com/code.tar.gz?version=3",
    }
    spec = job_spec(run=block, max_restarts_on_errors=2)
    response = client.post("/v1/jobs", json=spec, headers=headers)
    assert response.status_code == 201, response.text
    stored = client.get(f"/v1/jobs/{response.json()['id']}", headers=headers).json()["spec"]
    assert stored["run"] == block and stored["max_restarts_on_errors"] == 2
    defaults = client.post("/v1/jobs", json=job_spec(name="plain"), headers=headers).json()
    assert defaults["spec"]["run"] == {
        **RUN,
        "setup": None,
        "image": None,
        "env": {},
        "workdir": None,
    }
    assert defaults["spec"]["max_restarts_on_errors"] == 0


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "nvcr.io/nvidia/pytorch:24.08-py3",
        "localhost:5000/trainer",
        f"ghcr.io/org/trainer@{DIGEST}",
        f"trainer:latest@{DIGEST}",
    ],
)
def test_docker_image_references_are_accepted(client, make_team, image):
    _, headers = make_team()
    response = client.post("/v1/jobs", json=job_spec(run=run(image=image)), headers=headers)
    assert response.status_code == 201, response.text


def test_a_submission_needs_a_run_block_but_a_quote_does_not(client, make_team):
    _, headers = make_team()
    missing = client.post("/v1/jobs", json=quote_spec(), headers=headers)
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "run"]
    null = client.post("/v1/jobs", json=job_spec(run=None), headers=headers)
    assert null.status_code == 422 and null.json()["detail"][0]["loc"][:2] == ["body", "run"]
    without = client.post("/v1/quotes", json=quote_spec(), headers=headers)
    assert without.status_code == 200, without.text
    with_run = client.post("/v1/quotes", json=job_spec(max_restarts_on_errors=3), headers=headers)
    assert with_run.status_code == 200, with_run.text
    assert with_run.json() == without.json()  # the program changes no plan


def test_job_view_shows_the_deadline_outcome_and_the_on_demand_only_cost(
    client, make_team, db_engine, clock
):
    from datetime import datetime, timedelta

    from sqlmodel import Session

    from broker.db.models import Job
    from broker.services import lifecycle
    from broker.services.plans import job_plan
    from tests.helpers import LEASE

    _, headers = make_team(limit="1000.00")
    quote = client.post("/v1/quotes", json=job_spec(), headers=headers).json()
    job = client.post("/v1/jobs", json=job_spec(), headers=headers).json()
    assert job["deadline_met"] is None and job["completed_at"] is None
    assert job["saved_vs_on_demand"] is None
    figure = Decimal(job["on_demand_only_cost"])
    # the quote's figure with the planner's checkpoint writes left out
    assert Decimal("0.9") * Decimal(quote["cheapest_on_demand"]["expected_cost"]) < figure
    assert figure < Decimal(quote["cheapest_on_demand"]["expected_cost"])
    with Session(db_engine, expire_on_commit=False) as session:
        row = session.get(Job, job["id"])
        begun = lifecycle.begin_attempt(session, row.id, job_plan(row), clock.now())
        assert begun is not None
        lifecycle.launch_succeeded(session, begun[0].id, "i-1", clock.now(), lease_seconds=LEASE)
        late = row.deadline + timedelta(minutes=1)
        clock.set(late)
        lifecycle.program_exited(session, begun[0].id, 0, "", clock.now())
    shown = client.get(f"/v1/jobs/{job['id']}", headers=headers).json()
    assert shown["status"] == "succeeded" and shown["deadline_met"] is False
    assert datetime.fromisoformat(shown["completed_at"]) == late
    assert Decimal(shown["saved_vs_on_demand"]) == figure - Decimal(shown["spent"])
    listed = client.get("/v1/jobs", headers=headers).json()["items"]
    assert [(j["id"], j["deadline_met"]) for j in listed] == [(job["id"], False)]


def test_a_job_whose_launch_cannot_be_enqueued_is_admitted_and_the_next_tick_launches_it(
    client, make_team, engine, monkeypatch, caplog
):
    from broker.services import dispatch
    from broker.services.quoting import get_planning
    from broker.services.runner import Runner
    from broker.settings import get_settings

    _, headers = make_team()
    monkeypatch.setenv("BROKER_CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # nobody listens
    get_settings.cache_clear()
    dispatch._client.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="broker.services.dispatch"):
            response = client.post("/v1/jobs", json=job_spec(), headers=headers)
            assert dispatch.flush_launches()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        dispatch._client.cache_clear()
    assert response.status_code == 201, response.text
    assert "could not enqueue launch, tick will" in caplog.text
    tick = Runner(engine, {}, get_planning(), agent_secret="s", api_url="http://x", tick_seconds=1)
    assert response.json()["id"] in tick.due().launch
