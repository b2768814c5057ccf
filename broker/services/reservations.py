"""What a job holds of its team's budget: the bound of ``broker.core.reservation``, live.

Admission reserves it for the job's plan (``admission.submit``); a launch tops the job's hold
up to the least its remaining work needs on the chosen plan (``Runner.launch`` ->
``lifecycle.begin_attempt``); steering hands the policy the job's spend, its reservation and
the cost of finishing on on-demand (``finish_on_demand``), so its budget net keeps spend
within the reservation; when the net would move a job to on-demand only because it holds
too little, steering holds more first (``hold``), within ``max_cost`` and the team's free
budget. Going on-demand live re-plans on the cheapest on-demand plan that
meets the deadline (``fallback``), which is what these figures price. ``on_demand_only`` is
what a job would spend on that plan alone, the figure spot saves against.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from sqlmodel import Session

from broker import clock
from broker.core.job_status import is_terminal
from broker.core.offers import OfferTable
from broker.core.planner import Plan, PlanRequest
from broker.core.reservation import RESERVE_FACTOR, reservation
from broker.core.spend import plan_on_demand_only
from broker.db.models import Job
from broker.services.billing import MIN_BILLED_SECONDS
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved, job_spent, lock_team, reserve, team_budget
from broker.services.lifecycle import lock_job
from broker.services.plans import ChosenPlan
from broker.services.quoting import Planning, job_spec
from broker.settings import Settings, get_settings


def offer_prices(
    planning: Planning,
    provider: str,
    zone: str,
    instance_type: str,
    gpu: str = "",
    gpu_count: int = 0,
) -> tuple[int, int] | None:
    """(spot, on-demand) micro-dollars per hour of one machine of an offer the broker plans
    on (-1: that market is not offered); None when it plans on no such offer. ``gpu`` and
    ``gpu_count`` (when given) pick the row: a Compute Engine N1 type carries any of several
    GPUs, one or more of them, each at its own price."""
    offers = planning.offers
    rows = np.flatnonzero(
        shape_mask(offers, provider, instance_type, gpu, gpu_count) & (offers.zone == zone)
    )
    if not len(rows):
        return None
    i = int(rows[0])
    return int(offers.spot_micros_per_hour[i]), int(offers.on_demand_micros_per_hour[i])


def shape_mask(
    offers: OfferTable, provider: str, instance_type: str, gpu: str = "", gpu_count: int = 0
) -> np.ndarray:
    """The offers of ``provider``'s ``instance_type`` (carrying ``gpu_count`` ``gpu``, each
    when given), in every zone."""
    mask = (offers.provider == provider) & (offers.instance_type == instance_type)
    if gpu:
        mask &= offers.gpu == gpu
    if gpu_count:
        mask &= offers.gpu_count == gpu_count
    return mask


def tick_hours(settings: Settings | None = None) -> float:
    """Broker-clock hours between two decisions of the control loop."""
    return (settings or get_settings()).tick_seconds * clock.scale() / 3600


def fallback(planning: Planning, session: Session, job: Job, start: datetime) -> Plan | None:
    """The cheapest on-demand plan for the job's work left (from its latest checkpoint),
    started at ``start``, that meets the deadline (whatever its cost); None when none does.
    A gang's is a gang of the same shape (``quoting.job_spec``), priced whole."""
    if start >= job.deadline:
        return None
    plans = planning.quote(
        job_spec(job),
        start,
        learnt=planning.learnt(session),
        work_left=job.total_work - job.checkpointed_work,
        market="on_demand",
        top_n=1,
    )
    return plans.cheapest_on_demand


def _bound(
    planning: Planning,
    job: Job,
    plan: Plan | ChosenPlan,
    tick: float,
    factor: float,
    on_demand_only: float | None = None,
) -> float:
    """``broker.core.reservation`` with an on-demand plan's offer as ``po`` and ``W`` (its
    hours less the start-up): ``auto`` given ``on_demand_only``, else ``on_demand``."""
    return reservation(
        "on_demand" if on_demand_only is None else "auto",
        on_demand_price=float(plan.price_per_hour_micros),
        work_hours=max(plan.expected_hours - planning.startup_hours, 0.0),
        restart_hours=planning.restart_hours(job),
        tick_hours=tick,
        max_cost=float(job.max_cost_micros),
        on_demand_only=on_demand_only,
        factor=factor,
    )


def finish_on_demand(
    planning: Planning, session: Session, job: Job, now: datetime, tick: float
) -> float:
    """Micro-dollars that finishing on on-demand costs if it starts a tick from now, a tick
    of margin included (``PolicyState.on_demand_cost``); inf when no on-demand plan started
    then meets the deadline."""
    plan = fallback(planning, session, job, now + timedelta(hours=tick))
    if plan is None:
        return float("inf")
    rest = max(plan.expected_hours - planning.startup_hours, 0.0)
    return plan.price_per_hour_micros * (rest + planning.restart_hours(job) + tick)


def job_reservation(
    planning: Planning,
    session: Session,
    job: Job,
    plan: ChosenPlan,
    now: datetime,
    tick: float,
    factor: float = RESERVE_FACTOR,
    on_demand: Plan | None = None,
) -> int:
    """Micro-dollars to hold for the job's remaining work on ``plan``, within max_cost.

    A spot-market job: the planner's worst case. An on-demand plan: its cost plus a restart
    (an ``auto`` job's: the ``auto`` bound on it, as the policy may move it to spot). A spot
    plan of an ``auto`` job: ``factor`` x the cost of ``on_demand`` (default: the
    ``fallback`` from ``now``), at least that plan's cost plus a restart and a tick (factor 0:
    just that, the least the budget net needs); the planner's worst case when no on-demand
    plan meets the deadline.
    """
    worst = min(job.max_cost_micros, plan.worst_case_cost_micros)
    if job.market == "spot":
        return worst
    if plan.market == "on_demand":
        # an auto job may leave an on-demand plan for spot: it holds what the policy's budget
        # net needs for that (the auto bound on this plan), not the on-demand run alone
        only = float(plan.expected_cost_micros) if job.market == "auto" else None
        bound = _bound(planning, job, plan, tick, factor, only)
    else:
        on_demand = on_demand or fallback(planning, session, job, now)
        if on_demand is None:
            return worst
        only = float(on_demand.expected_cost_micros)
        bound = _bound(planning, job, on_demand, tick, factor, only)
    return min(job.max_cost_micros, int(bound))  # down: the proof needs only po x (W + R)


def on_demand_only(spec: JobSpec, plan: Plan | None, startup_hours: float) -> int | None:
    """What ``spec`` would spend on the on-demand ``plan`` alone (the quote's cheapest on-time
    one), booked as spend is (``broker.core.spend``); None without such a plan."""
    if plan is None:
        return None
    return plan_on_demand_only(
        plan,
        startup_hours=startup_hours,
        interval_hours=spec.checkpoint.interval_minutes / 60.0,
        write_hours=spec.checkpoint.size_gb * PlanRequest.checkpoint_seconds_per_gb / 3600.0,
        min_billed_seconds=MIN_BILLED_SECONDS.get(plan.provider, 60.0),
    )


def hold(session: Session, job: Job, need: int, want: int, now: datetime) -> int:
    """Raise what ``job`` holds (spent included, micro-dollars) towards ``want``, as far as
    ``max_cost`` and its team's free budget allow, when it holds less than ``need``; one
    transaction, committed (the team row is locked only for it). Returns what the job holds
    after it: the top-up is taken only when it reaches ``need``."""
    want = min(want, job.max_cost_micros)
    if want < need:
        return job_spent(session, job.id) + job_reserved(session, job.id)
    # The job's row first (as lifecycle takes it, then the team's): a job that ended since
    # its decision (another worker booked its exit and released its hold) gets no new hold.
    if is_terminal(lock_job(session, job.id).status):
        session.rollback()
        return job_spent(session, job.id) + job_reserved(session, job.id)
    team = lock_team(session, job.team_id)
    held = job_spent(session, job.id) + job_reserved(session, job.id)  # under the lock
    if held >= need:
        session.rollback()
        return held
    top_up = min(want - held, max(team_budget(session, team, now).available, 0))
    if held + top_up < need:
        session.rollback()
        return held
    reserve(session, team, job, top_up, now)
    session.commit()
    return held + top_up
