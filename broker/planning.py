"""Quotes: the bundled catalog and throughput model fed to the pure planner."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from broker.errors import Infeasible, InvalidInput
from broker.money import format_usd
from broker.planner import Plan, PlanSet, quote
from broker.spec import JobSpec
from broker.throughput import ThroughputModel
from pricing.catalog import OfferTable, bundled_catalog


@lru_cache
def _bundled() -> tuple[OfferTable, ThroughputModel]:
    return bundled_catalog(), ThroughputModel.bundled()


def plan_fields(plan: Plan) -> dict[str, Any]:
    """A plan as API.md shows it (money as decimal strings)."""
    return {
        "provider": plan.provider,
        "region": plan.region,
        "zone": plan.zone,
        "instance_type": plan.instance_type,
        "gpu": plan.gpu,
        "gpu_count": plan.gpu_count,
        "market": plan.market,
        "price_per_hour": format_usd(plan.price_per_hour_micros),
        "expected_hours": round(plan.expected_hours, 4),
        "expected_cost": format_usd(plan.expected_cost_micros),
        "worst_case_cost": format_usd(plan.worst_case_cost_micros),
        "p_deadline": round(plan.p_deadline, 4),
    }


def quote_job(spec: JobSpec, now: datetime) -> PlanSet:
    """Ranked plans for ``spec`` at ``now``; Infeasible (422) when none fits, with why."""
    offers, model = _bundled()
    if spec.deadline <= now:
        raise InvalidInput(f"deadline {spec.deadline.isoformat()} is in the past", "deadline")
    try:
        plans = quote(spec, offers, model, now)
    except ValueError as error:
        raise InvalidInput(str(error), "workload") from None
    if not plans.plans:
        reason = plans.infeasible_reason
        raise Infeasible(reason.message if reason else "no plan meets the deadline and max_cost")
    return plans
