"""``broker quote``: ranked plans for a job file, as the API ranks them."""

from __future__ import annotations

import re
from datetime import timedelta

from tests.cli.support import EXAMPLE, failed, job_file, ok
from tests.conftest import START


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


def test_infeasible_quote_prints_the_api_message(broker_cli, team_key, tmp_path):
    _, token = team_key
    out = failed(broker_cli("quote", str(job_file(tmp_path, max_cost='"0.01"')), token=token))
    assert "infeasible" in out and "HTTP 422" in out


def test_a_gang_quote_prints_its_nodes_and_whole_price(broker_cli, team_key, tmp_path):
    _, token = team_key
    spec = job_file(tmp_path, resources="{gpus: 32, gpu_types: [H100]}", max_cost='"5000.00"')
    out = ok(broker_cli("quote", str(spec), token=token))
    assert "nodes" in out
    first_row = next(line for line in out.splitlines() if re.match(r"\W*1\W", line))
    cells = [c.strip() for c in re.split(r"[│|]", first_row) if c.strip()]
    assert "4" in cells and "H100 x8" in cells
    assert "cheapest on-demand" in out and "4 x " in out and "(32 GPUs)" in out
