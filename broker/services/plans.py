"""Plans as the services pass them around and store them: typed, money in integer micro-dollars.

A :class:`ChosenPlan` is what admission picked, what a re-plan offers an attempt and what
``Job.plan`` holds (as ``to_json()``). Only the API's presentation (``broker.api.present``)
and the CLI and dashboard turn its figures into decimal strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from broker.core.offers import BUNDLED
from broker.core.planner import Plan
from broker.db.models import Job


@dataclass(frozen=True)
class ChosenPlan:
    """An offer on one market with its hourly price (when it was observed and where it came
    from; None: the bundled snapshot), expected time and cost, worst case and odds of
    meeting the deadline. A gang plan runs ``nodes`` instances of the offer, ``gpu_count``
    GPUs each; its price and costs are the whole gang's."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: str
    price_per_hour_micros: int
    expected_hours: float
    expected_cost_micros: int
    worst_case_cost_micros: int
    p_deadline: float
    price_observed_at: datetime | None = None
    price_source: str = BUNDLED
    nodes: int = 1

    @classmethod
    def from_plan(cls, plan: Plan) -> ChosenPlan:
        """The planner's answer, as services keep it."""
        return cls(
            provider=plan.provider,
            region=plan.region,
            zone=plan.zone,
            instance_type=plan.instance_type,
            gpu=plan.gpu,
            gpu_count=int(plan.gpu_count),
            market=plan.market,
            price_per_hour_micros=int(plan.price_per_hour_micros),
            expected_hours=float(plan.expected_hours),
            expected_cost_micros=int(plan.expected_cost_micros),
            worst_case_cost_micros=int(plan.worst_case_cost_micros),
            p_deadline=float(plan.p_deadline),
            price_observed_at=plan.price_observed_at,
            price_source=str(plan.price_source),
            nodes=int(plan.nodes),
        )

    def start_by(self, deadline: datetime) -> datetime:
        """The latest start that meets ``deadline`` on this plan (``Job.start_by``)."""
        return deadline - timedelta(hours=self.expected_hours)

    def to_json(self) -> dict[str, Any]:
        """The plan as the ``Job.plan`` column stores it (money as integers, time as ISO)."""
        data = asdict(self)
        at = self.price_observed_at
        data["price_observed_at"] = at.isoformat() if at else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChosenPlan:
        """A plan from the ``Job.plan`` column (KeyError when a field is missing; a plan
        stored before prices carried their origin has the bundled snapshot's)."""
        at = data.get("price_observed_at")
        return cls(
            provider=data["provider"],
            region=data["region"],
            zone=data["zone"],
            instance_type=data["instance_type"],
            gpu=data["gpu"],
            gpu_count=int(data["gpu_count"]),
            market=data["market"],
            price_per_hour_micros=int(data["price_per_hour_micros"]),
            expected_hours=float(data["expected_hours"]),
            expected_cost_micros=int(data["expected_cost_micros"]),
            worst_case_cost_micros=int(data["worst_case_cost_micros"]),
            p_deadline=float(data["p_deadline"]),
            price_observed_at=datetime.fromisoformat(at) if at else None,
            price_source=data.get("price_source") or BUNDLED,
            nodes=int(data.get("nodes", 1)),
        )


def job_plan(job: Job) -> ChosenPlan | None:
    """The plan a job runs on (admission's, then each attempt's), or None before it has one."""
    return ChosenPlan.from_json(job.plan) if job.plan else None


@dataclass(frozen=True)
class Replan:
    """Plans for a job's remaining work, best first, or why there is none (``stop`` names
    the status the job should end in)."""

    choices: list[ChosenPlan]
    stop: Literal["budget_exhausted", "deadline_missed"] | None = None
    reason: str | None = None
