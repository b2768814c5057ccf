"""Turning service results into response bodies: the one place money becomes decimal strings."""

from __future__ import annotations

from typing import Any

from broker.api.schemas import (
    AttemptOut,
    BudgetOut,
    CheckpointOut,
    JobOut,
    JobSummary,
    PlanOut,
    PriceOut,
    ProgressOut,
    SpendOut,
    SpendRow,
    TeamOut,
)
from broker.core.job_status import deadline_met
from broker.core.money import format_usd
from broker.core.planner import Plan
from broker.core.spend import on_demand_saving
from broker.db.models import Attempt, Checkpoint, Job, Team
from broker.services.job_views import JobView
from broker.services.ledger import BudgetFigures
from broker.services.market_prices import PriceRow
from broker.services.plans import ChosenPlan, job_plan


def budget_out(figures: BudgetFigures) -> BudgetOut:
    return BudgetOut(
        limit=format_usd(figures.limit),
        period=figures.period,
        period_start=figures.period_start,
        spent=format_usd(figures.spent),
        reserved=format_usd(figures.reserved),
        available=format_usd(figures.available),
        alert=figures.alert,
        alert_at=figures.alert_at,
    )


def spend_out(rows: list[tuple[str, int]]) -> SpendOut:
    return SpendOut(
        rows=[SpendRow(key=key, amount=format_usd(amount)) for key, amount in rows],
        total=format_usd(sum(amount for _, amount in rows)),
    )


def team_out(team: Team, figures: BudgetFigures) -> TeamOut:
    return TeamOut(
        id=team.id, name=team.name, budget=budget_out(figures), created_at=team.created_at
    )


def plan_fields(plan: Plan | ChosenPlan) -> dict[str, Any]:
    """A plan as docs/api.md shows it (money as decimal strings)."""
    return {
        "provider": plan.provider,
        "region": plan.region,
        "zone": plan.zone,
        "instance_type": plan.instance_type,
        "gpu": plan.gpu,
        "gpu_count": plan.gpu_count,
        "nodes": plan.nodes,
        "total_gpus": plan.nodes * plan.gpu_count,
        "market": plan.market,
        "price_per_hour": format_usd(plan.price_per_hour_micros),
        "expected_hours": round(plan.expected_hours, 4),
        "expected_cost": format_usd(plan.expected_cost_micros),
        "worst_case_cost": format_usd(plan.worst_case_cost_micros),
        "p_deadline": round(plan.p_deadline, 4),
        "price_observed_at": plan.price_observed_at,
        "price_source": plan.price_source,
    }


def price_out(row: PriceRow) -> PriceOut:
    return PriceOut(
        provider=row.provider,
        region=row.region,
        zone=row.zone,
        instance_type=row.instance_type,
        gpu=row.gpu,
        gpu_count=row.gpu_count,
        market=row.market,
        price_per_hour=format_usd(row.micros_per_hour),
        observed_at=row.observed_at,
        source=row.source,
    )


def plan_out(plan: ChosenPlan | None) -> PlanOut | None:
    return PlanOut.model_validate(plan_fields(plan)) if plan else None


def progress_out(job: Job) -> ProgressOut:
    fraction = min(job.work_done / job.total_work, 1.0) if job.total_work else 0.0
    return ProgressOut(
        work_done=job.work_done,
        checkpointed_work=job.checkpointed_work,
        total_work=job.total_work,
        fraction=round(fraction, 6),
    )


def attempt_out(attempt: Attempt) -> AttemptOut:
    return AttemptOut(
        id=attempt.id,
        provider=attempt.provider,
        region=attempt.region,
        zone=attempt.zone,
        instance_type=attempt.instance_type,
        gpu=attempt.gpu,
        gpu_count=attempt.gpu_count,
        nodes=attempt.nodes,
        market=attempt.market,
        price_per_hour=format_usd(attempt.price_micros_per_hour),
        instance_id=attempt.instance_id,
        status=attempt.status,
        started_at=attempt.started_at,
        ended_at=attempt.ended_at,
        end_reason=attempt.end_reason,
        billed_seconds=attempt.billed_seconds,
        cost=format_usd(attempt.cost_micros),
        work_done=attempt.work_done,
        exit_code=attempt.exit_code,
    )


def checkpoint_out(checkpoint: Checkpoint) -> CheckpointOut:
    return CheckpointOut(
        id=checkpoint.id,
        attempt_id=checkpoint.attempt_id,
        work_done=checkpoint.work_done,
        object_key=checkpoint.object_key,
        created_at=checkpoint.created_at,
    )


def job_summary(job: Job) -> JobSummary:
    return JobSummary(
        id=job.id,
        name=job.name,
        status=job.status,
        market=job.market,
        plan=plan_out(job_plan(job)),
        max_cost=format_usd(job.max_cost_micros),
        deadline=job.deadline,
        progress=progress_out(job),
        created_at=job.created_at,
        finished_at=job.finished_at,
        completed_at=job.completed_at,
        deadline_met=deadline_met(job.status, job.completed_at, job.deadline),
    )


def job_out(view: JobView) -> JobOut:
    job = view.job
    od = job.on_demand_only_micros
    saved = on_demand_saving(job.status, od, view.spent)
    return JobOut(
        id=job.id,
        name=job.name,
        status=job.status,
        status_reason=job.status_reason,
        spec=job.spec,
        plan=plan_out(job_plan(job)),
        attempts=[attempt_out(a) for a in view.attempts],
        checkpoints=[checkpoint_out(c) for c in view.checkpoints],
        spent=format_usd(view.spent),
        reserved=format_usd(view.reserved),
        max_cost=format_usd(job.max_cost_micros),
        deadline=job.deadline,
        progress=progress_out(job),
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
        completed_at=job.completed_at,
        deadline_met=deadline_met(job.status, job.completed_at, job.deadline),
        on_demand_only_cost=None if od is None else format_usd(od),
        saved_vs_on_demand=None if saved is None else format_usd(saved),
    )
