"""An infeasible request's message names the field to change and the values that would fit."""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.money import usd_text
from broker.core.offers import Offer, OfferTable
from broker.core.planner import PlanRequest, rank_plans


def _offer(gpu: str, count: int, region: str, memory: float = 16.0) -> Offer:
    return Offer(
        provider="aws",
        region=region,
        zone=f"{region}-az1",
        instance_type=f"{gpu.lower()}.{count}x",
        gpu=gpu,
        gpu_count=count,
        gpu_memory_gb=memory,
        vcpus=8.0 * count,
        ram_gb=61.0 * count,
        on_demand_micros_per_hour=3_000_000 * count,
        spot_micros_per_hour=1_000_000 * count,
        spot_risk=0.1,
    )


OFFERS = OfferTable.from_offers(
    [
        _offer("V100", 1, "us-east-1"),
        _offer("V100", 4, "us-east-1"),
        _offer("A100", 8, "us-west-2", 40.0),
        _offer("A10G", 1, "us-west-2", 24.0),
    ]
)


def _why(rated: np.ndarray | None = None, **changes: object) -> str:
    fields: dict = dict(gpus=1, total_work=10.0, deadline_hours=100.0, max_cost_micros=10**12)
    fields.update(changes)
    plans = rank_plans(
        PlanRequest(**fields), OFFERS, np.ones(len(OFFERS)) if rated is None else rated
    )
    assert not plans.plans and plans.infeasible_reason is not None
    return plans.infeasible_reason.message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"gpu_types": ("X100",)},
            "no offer matches gpu_types=['X100']; known GPUs: A100, A10G, V100",
        ),
        (
            {"gpu_types": ("v100",), "gpus": 2},
            "no offer matches gpus=2; GPU counts of one machine: 1, 4",
        ),
        (
            {"gpu_types": ("V100",), "regions": ("eu-west-1",)},
            "no offer matches regions=['eu-west-1']; regions offering them: us-east-1",
        ),
        (
            {"min_gpu_memory_gb": 80.0},
            "no offer matches min_gpu_memory_gb=80.0; the most memory per GPU is 24 GB",
        ),
        (
            {"vcpus_per_gpu": 32.0},
            "no offer matches vcpus_per_gpu=32.0; the most is 8 vCPUs per GPU",
        ),
    ],
)
def test_the_first_filter_that_leaves_nothing_is_named_with_what_would_fit(
    changes: dict, message: str
) -> None:
    assert _why(**changes) == message


def test_gpu_names_match_whatever_their_case() -> None:
    request = PlanRequest(
        gpus=1, total_work=10.0, deadline_hours=100.0, max_cost_micros=10**12, gpu_types=("a10g",)
    )
    plans = rank_plans(request, OFFERS, np.ones(len(OFFERS)))
    assert {p.gpu for p in plans.plans} == {"A10G"}


def test_a_gpu_the_model_cannot_rate_says_so() -> None:
    rated = np.array([1.0, 1.0, 1.0, 0.0])
    message = _why(rated, gpu_types=("A10G",))
    assert message.startswith("the throughput model cannot rate this workload")
    assert "(A10G)" in message


def test_an_over_budget_request_quotes_dollars_not_micro_dollars() -> None:
    message = _why(max_cost_micros=1_500_000)
    assert "max_cost ($1.50)" in message
    assert "micro" not in message
    assert "raise max_cost to at least $" in message


def test_usd_text_rounds_up_to_the_cent() -> None:
    assert usd_text(25_194_235) == "$25.20"
    assert usd_text(1_234_000_000) == "$1,234.00"
