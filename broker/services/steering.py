"""Steering: whether a job should change market (spot, on-demand) or leave a zone now.

This module gathers the live facts the policy needs (the job's deadline, work left and its
speed with the learnt corrections, the attempt it runs, the spot and on-demand prices of its
offer, its spend and reservation, the spot history the broker's own attempts saw, its shape's
zones and those that refused or preempted spot lately) and asks
``broker.core.policy.decide`` - the same policy the simulator measures. It only decides; the
runner (``broker.services.runner``) carries a move out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

import numpy as np
from sqlalchemy import ColumnElement, func
from sqlmodel import Session, col, select

from broker.core import policy
from broker.core.money import MICROS_PER_DOLLAR
from broker.core.spot_model import attempt_sightings, family
from broker.db.models import Attempt, Job
from broker.services import spot_model
from broker.services.ledger import job_reserved, job_spent
from broker.services.metrics import BUDGET_HOLDS, POLICY_PLANS
from broker.services.plans import ChosenPlan, job_plan
from broker.services.quoting import Planning
from broker.services.reservations import finish_on_demand, hold, offer_prices, shape_mask

log = logging.getLogger(__name__)

Steer = Literal["continue", "on_demand", "spot"]
REFUSED_HOURS = policy.REFUSED_HOURS  # the simulator's observed view applies them too
MOVE_BACK_HOURS = policy.MOVE_BACK_HOURS


@dataclass(frozen=True)
class FleetView:
    """What every job's decision at one instant shares, read once for a batch of them: spot
    availability as the broker's own attempts saw it (``spot_history``), the zones that
    refused or preempted spot lately (``refused``: within ``REFUSED_HOURS``) and those that
    did within ``MOVE_BACK_HOURS``, with their (provider, region) (``refused_lately``)."""

    history: policy.AvailabilityHistory
    refused: set[str]
    refused_lately: dict[str, tuple[str, str]]


def fleet_view(session: Session, now: datetime) -> FleetView:
    """The fleet's view at ``now`` (two queries)."""
    last = last_refusals(session, now, MOVE_BACK_HOURS)
    recent = now - timedelta(hours=REFUSED_HOURS)
    refused = {zone for zone, (at, _) in last.items() if at >= recent}
    lately = {zone: where for zone, (_, where) in last.items()}
    return FleetView(spot_history(session, now), refused, lately)


def move_back_excluded(planning: Planning, view: FleetView) -> set[str]:
    """Zones a running on-demand attempt does not leave for (the policy weighs them as
    without spot, the move's launch skips them): those refused within ``REFUSED_HOURS``,
    and, unless an attempt has seen spot there since, every zone of a region one of whose
    zones refused or preempted spot within ``MOVE_BACK_HOURS``.

    A move refused for capacity once cost a restart (the on-demand instance ended before
    the spot one ran; now it ends only once spot runs, ``Runner._replace``); a new job's
    launch, which risks nothing, finds spot sooner, as the simulator's observed view shows
    spot only where it was last seen. A region's zones
    run out of spot together: in the bundled traces a zone is down 73-95 % of the time
    another zone of its region is, against 45-90 % of all the time (``docs/architecture.md``).
    """
    seen = view.history
    regions = {where for zone, where in view.refused_lately.items() if not _seen_since(seen, zone)}
    if not regions:
        return set(view.refused)
    offers = planning.offers
    mask = np.zeros(len(offers), bool)
    for provider, region in regions:
        mask |= (offers.provider == provider) & (offers.region == region)
    siblings = {str(zone) for zone in np.unique(offers.zone[mask])} | set(view.refused_lately)
    return view.refused | {zone for zone in siblings if not _seen_since(seen, zone)}


def _decide(state: policy.PolicyState) -> policy.Decision:
    """``policy.decide``, counting whether its plan was kept or solved (``POLICY_PLANS``)."""
    before = policy.PLANS.stats()
    decision = policy.decide(state)
    after = policy.PLANS.stats()
    shared = after.shared - before.shared
    for result, count in (
        ("hit", after.hits - before.hits),
        ("shared", shared),
        ("miss", after.misses - before.misses - shared),
    ):
        if count > 0:
            POLICY_PLANS.labels(result).inc(count)
    return decision


def market_now(
    planning: Planning, session: Session, job: Job, now: datetime, tick_hours: float
) -> str | None:
    """The market the policy wants for a job with nothing running (None: the plan's).

    ``policy.decide`` with no instance, as the simulator asks it: spot while it is safe
    (even when admission planned on-demand: the policy knows it can leave spot in time),
    provided a spot plan fits what is left (``Planning.plans_for_job``: the policy's spot
    plans); on-demand when the plan says so, or once waiting any longer would put the
    deadline at risk; "wait" when the policy would hold nothing now. When every zone the
    job knows has refused or preempted spot lately (``FleetView.refused``, unless an
    attempt has seen spot there since), the policy weighs waiting for spot against
    on-demand from the chain's expected outage and the job's slack, as the simulator does:
    on "wait" the launch asks for spot once a tick, as the simulated broker keeps a spot
    request open (``Runner.launch``), and the policy takes on-demand while that still meets
    the deadline.
    """
    if job.market != "auto":
        return None
    view = fleet_view(session, now)
    state = policy_state(planning, session, job, None, now, tick_hours, view)
    if state is None:
        return None
    decision = _held(session, job, state, _decide(state), now)
    if decision.action == policy.Action.ON_DEMAND:
        return "on_demand"
    if not any(state.spot_obtainable):
        return "wait"  # no spot to be had, and the policy would rather wait than pay on-demand
    if decision.action == policy.Action.SPOT:
        # spot, even on a spot plan: the planner's own mix of markets would leave out, for
        # its on-demand plans too, the zones where the job's spot was refused or preempted
        refused = view.refused
        spot = planning.plans_for_job(session, job, now, market="spot", exclude_zones=refused)
        if spot.stop is None and _unrefused(spot.choices, refused):
            return "spot"
        return None
    # The policy holds nothing for now (spot is believed there, but its plan would rather
    # wait): wait, asking for spot once a tick, as the simulated broker does; the admission
    # plan's on-demand would be a choice the policy did not make.
    return "wait"


def steer(
    planning: Planning,
    session: Session,
    job: Job,
    attempt: Attempt,
    now: datetime,
    tick_hours: float,
    view: FleetView | None = None,
) -> Steer:
    """Keep a running attempt, or switch its market when the policy says so.

    ``policy.decide`` (the ``broker`` policy the simulator measures) may move a spot job to
    on-demand when its plan says so. An on-demand attempt of an ``auto`` job moves back to
    spot when the policy says so, the move paying for the work since the checkpoint with a
    margin (``_back_to_spot``).

    What only the live broker can know stays here: a move is only worth it when an
    on-demand plan can still meet the deadline (and fit the budget) from the latest
    checkpoint; when none can but the running instance, with the work it did since, can
    still finish in time, it is the job's only chance: keep it. Once not even it can, the
    move hands the job to the re-plan, which ends it. ``view``: the fleet's view at ``now``
    when a batch of decisions shares it (read here otherwise).
    """
    if attempt.market == "on_demand":
        if job.market != "auto":
            return "continue"
        view = view or fleet_view(session, now)
        return _back_to_spot(planning, session, job, attempt, now, tick_hours, view)
    if job.market == "spot":
        return "continue"
    state = policy_state(planning, session, job, attempt, now, tick_hours, view)
    if state is None:
        return "continue"
    work_per_hour = job.total_work / state.work_total_hours
    finish_hours = max(job.total_work - job.work_done, 0.0) / work_per_hour
    in_time = finish_hours + state.restart_left_hours <= state.hours_to_deadline
    if in_time and _held(session, job, state, _decide(state), now).action != (
        policy.Action.ON_DEMAND
    ):
        return "continue"
    if planning.plans_for_job(session, job, now, market="on_demand").choices:
        _log_switch(job, attempt, state, "on_demand", "policy" if in_time else "late")
        return "on_demand"
    if in_time:
        return "continue"
    _log_switch(job, attempt, state, "on_demand", "late, no on-demand plan: re-plan")
    return "on_demand"


def _held(
    session: Session, job: Job, state: policy.PolicyState, decision: policy.Decision, now: datetime
) -> policy.Decision:
    """``decision`` once the job holds what it needs for it: when the budget net asks for more
    (``Decision.hold``), the job's hold is raised (``reservations.hold``, within max_cost and
    its team's free budget); when that falls short, the policy's decision on what the job
    holds (the net's on-demand)."""
    if decision.hold <= state.reserved:
        return decision
    need = policy.net_need(state, decision)
    assert need is not None  # a hold is asked only for a decision the net weighs
    need_micros = math.ceil(need * MICROS_PER_DOLLAR)
    held = hold(session, job, need_micros, int(decision.hold * MICROS_PER_DOLLAR), now)
    extra = {"job_id": job.id, "zone": state.zone}
    if held >= need_micros:
        BUDGET_HOLDS.labels("held").inc()
        log.info(
            "budget hold: $%.2f held (was $%.2f, spent $%.2f), so %s rather than on-demand",
            held / MICROS_PER_DOLLAR,
            state.reserved,
            state.spent,
            decision.action.name.lower(),
            extra=extra,
        )
        return decision
    BUDGET_HOLDS.labels("short").inc()
    log.info(
        "budget hold short: $%.2f held, $%.2f needed", held / MICROS_PER_DOLLAR, need, extra=extra
    )
    return _decide(state.with_(reserved=held / MICROS_PER_DOLLAR, reserve_limit=None))


def _log_switch(job: Job, attempt: Attempt, state: policy.PolicyState, to: str, why: str) -> None:
    """Say why a running attempt leaves its market (INFO): what the policy weighed."""
    log.info(
        "market switch to %s (%s): %.2f h to deadline, %.2f h of work left, spent $%.2f of "
        "$%.2f held, on-demand finish $%.2f, spot $%.3f/h, on-demand $%.3f/h",
        to,
        why,
        state.hours_to_deadline,
        state.work_left_hours,
        state.spent,
        state.reserved,
        state.on_demand_cost,
        state.spot_price,
        state.on_demand_price,
        extra={"job_id": job.id, "attempt_id": attempt.id, "zone": attempt.zone},
    )


def _back_to_spot(
    planning: Planning,
    session: Session,
    job: Job,
    attempt: Attempt,
    now: datetime,
    tick_hours: float,
    view: FleetView,
) -> Steer:
    """Spot when the policy would leave on-demand for spot (in a zone outside
    ``move_back_excluded``, the move paying for the work since the checkpoint) and a
    spot plan fits what is left outside those zones."""
    if job.market != "auto":
        return "continue"
    state = policy_state(planning, session, job, attempt, now, tick_hours, view)
    if state is None:
        return "continue"
    excluded = move_back_excluded(planning, view)
    last_seen = tuple(
        obtainable and zone not in excluded
        for zone, obtainable in zip(state.zones, state.spot_obtainable, strict=True)
    )
    state = state.with_(spot_obtainable=last_seen)
    if _held(session, job, state, _decide(state), now).action != policy.Action.SPOT:
        return "continue"
    # The launch skips the excluded zones too (``Runner.launch``'s ``exclude_zones``): a
    # spot plan must fit outside them.
    spot = planning.plans_for_job(session, job, now, market="spot", exclude_zones=excluded)
    if not _unrefused(spot.choices, excluded):
        return "continue"
    _log_switch(job, attempt, state, "spot", "policy")
    return "spot"


def _unrefused(choices: list[ChosenPlan], refused: set[str]) -> bool:
    """A spot plan outside the zones that refused or preempted spot lately (the planner
    offers them still when nothing else fits: moving there would only be refused again)."""
    return any(choice.zone not in refused for choice in choices)


def policy_state(
    planning: Planning,
    session: Session,
    job: Job,
    attempt: Attempt | None,
    now: datetime,
    tick_hours: float,
    view: FleetView | None = None,
) -> policy.PolicyState | None:
    """What ``policy.decide`` sees of a job (and its running attempt, if any) at ``now``:
    prices in $/h of the offer it runs or plans on, spend and reservation in $ from the
    ledger, what finishing on on-demand costs (``reservations.finish_on_demand``), its
    shape's zones (``candidate_zones``); None when the job's speed is unknown (no plan yet,
    or a GPU the model cannot rate)."""
    plan = job_plan(job)
    gpu = attempt.gpu if attempt else (plan.gpu if plan else None)
    count = attempt.gpu_count if attempt else (plan.gpu_count if plan else None)
    if not gpu or not count:
        return None
    nodes = attempt.nodes if attempt else (plan.nodes if plan else 1)
    rate = planning.rate(session, job, gpu, int(count), int(nodes))
    if rate <= 0:
        return None
    restart = planning.restart_hours(job)
    restart_left = 0.0
    instance = policy.Instance.NONE
    if attempt is not None:
        instance = policy.Instance.SPOT if attempt.market == "spot" else policy.Instance.ON_DEMAND
        if attempt.work_done <= attempt.work_at_start and attempt.started_at is not None:
            ran = (now - attempt.started_at).total_seconds() / 3600
            restart_left = max(restart - ran, 0.0)
    where = attempt or plan
    assert where is not None  # a GPU came from one of them
    spot_price, on_demand_price = _prices(planning, where)
    view = view or fleet_view(session, now)
    live = view.history
    # Live, spot is known only where an attempt ran or tried to launch: the policy weighs
    # those of the shape's zones (and the job's own), not zones no launch has tried.
    zones = tuple(
        z
        for z in candidate_zones(
            planning,
            where.provider,
            where.instance_type,
            where.zone,
            gpu,
            int(count),
            job.spec.get("resources", {}).get("regions"),
        )
        if z == where.zone or z in live.zones
    )
    history = zone_histories(
        planning, session, where.provider, where.instance_type, where.gpu, zones, live
    )
    refused = view.refused
    running_spot = attempt.zone if attempt is not None and attempt.market == "spot" else None
    spent = job_spent(session, job.id)
    finish = finish_on_demand(planning, session, job, now, tick_hours)
    return policy.PolicyState(
        hours_to_deadline=(job.deadline - now).total_seconds() / 3600,
        hours_total=(job.deadline - job.created_at).total_seconds() / 3600,
        work_left_hours=(job.total_work - job.checkpointed_work) / rate,
        work_total_hours=job.total_work / rate,
        restart_hours=restart,
        restart_left_hours=restart_left,
        unsaved_hours=max(job.work_done - job.checkpointed_work, 0.0) / rate,
        tick_hours=tick_hours,
        instance=instance,
        zone=running_spot,
        zones=zones,
        spot_obtainable=tuple(
            z == running_spot or z not in refused or _seen_since(live, z) for z in zones
        ),
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        spent=spent / MICROS_PER_DOLLAR,
        reserved=(spent + job_reserved(session, job.id)) / MICROS_PER_DOLLAR,
        reserve_limit=job.max_cost_micros / MICROS_PER_DOLLAR,
        on_demand_cost=finish / MICROS_PER_DOLLAR,
        history=history,
    )


def _seen_since(live: policy.AvailabilityHistory, zone: str) -> bool:
    """Whether the broker's attempts last saw spot in ``zone`` (one ran there after its
    latest refusal)."""
    seen = live.zones.get(zone)
    return seen is not None and seen.last_available


def _prices(planning: Planning, where: Attempt | ChosenPlan) -> tuple[float, float]:
    """$/h on spot and on-demand of the offer a job runs or plans on, a gang's whole (its
    machine's price x its nodes, as it pays). A market the offer lacks (or an offer no
    longer planned on) takes the other's price, or the one it pays."""
    if isinstance(where, Attempt):
        paid = where.price_micros_per_hour
    else:
        paid = where.price_per_hour_micros
    listed = offer_prices(
        planning,
        where.provider,
        where.zone,
        where.instance_type,
        where.gpu or "",
        int(where.gpu_count or 0),
    )
    spot, on_demand = listed if listed is not None else (-1, -1)
    nodes = max(int(where.nodes), 1)
    spot, on_demand = (p * nodes if p >= 0 else p for p in (spot, on_demand))
    if where.market == "spot":
        spot = paid
    else:
        on_demand = paid
    spot = spot if spot >= 0 else on_demand
    on_demand = on_demand if on_demand >= 0 else spot
    return spot / MICROS_PER_DOLLAR, on_demand / MICROS_PER_DOLLAR


def candidate_zones(
    planning: Planning,
    provider: str,
    instance_type: str,
    zone: str,
    gpu: str = "",
    gpu_count: int = 0,
    regions: Sequence[str] | None = None,
) -> tuple[str, ...]:
    """The zones the job could run its shape on spot in: ``zone`` first, then every other
    zone of the provider offering ``instance_type`` (with ``gpu_count`` ``gpu``, when given)
    on spot in ``regions`` (the job's, when it names them), cheapest spot first."""
    offers = planning.offers
    mask = (
        shape_mask(offers, provider, instance_type, gpu, gpu_count)
        & (offers.spot_micros_per_hour >= 0)
        & (offers.zone != zone)
    )
    if regions is not None:
        mask &= np.isin(offers.region, list(regions))
    rows = np.flatnonzero(mask)
    order = sorted(rows, key=lambda i: (int(offers.spot_micros_per_hour[i]), str(offers.zone[i])))
    return (zone, *dict.fromkeys(str(offers.zone[i]) for i in order))


def zone_histories(
    planning: Planning,
    session: Session,
    provider: str,
    instance_type: str,
    gpu: str,
    zones: tuple[str, ...],
    observed: policy.AvailabilityHistory,
) -> policy.AvailabilityHistory:
    """The shared spot model's history of the job's candidate zones (``spot_model``: the
    traces' prior and every attempt's observations as of its latest refit), with each
    zone's current state and age as the broker's own attempts see it now (``observed``,
    from ``spot_history``: a refit may be minutes old; the policy reads the current
    window's age). The shared histories are the process's copy for the model's version
    (``Planning.spot_histories``)."""
    shape = family(provider, instance_type, gpu)
    shared = planning.spot_histories(session, [(provider, zone, shape) for zone in zones])
    live = observed.zones
    merged = dict(shared.zones)
    for zone, seen in shared.zones.items():
        if zone in live:
            now_seen = live[zone]
            merged[zone] = replace(
                seen, last_available=now_seen.last_available, age_hours=now_seen.age_hours
            )
    return policy.AvailabilityHistory(merged)


def refused_zones(
    session: Session,
    now: datetime,
    job_id: str | None = None,
    hours: float = REFUSED_HOURS,
    market: str | None = None,
) -> set[str]:
    """Zones that refused a launch (capacity) or preempted an instance within ``hours``:
    any job's spot attempts, or with ``job_id`` that job's attempts on ``market`` (None:
    either). A zone out of spot may well have on-demand: an on-demand launch leaves out only
    the zones that refused on-demand (before, the demo's ``resnet50-tight`` took a $3.67/h
    on-demand A100 over the $2.95/h one in the zone whose spot had just preempted it)."""
    query = select(Attempt.zone).where(*_refusals(now, hours))
    if job_id is None:
        query = query.where(Attempt.market == "spot")
    else:
        query = query.where(Attempt.job_id == job_id)
        if market is not None:
            query = query.where(Attempt.market == market)
    return set(session.exec(query).all())


def last_refusals(
    session: Session, now: datetime, hours: float
) -> dict[str, tuple[datetime, tuple[str, str]]]:
    """Each zone whose spot refused a launch or preempted an instance within ``hours``, with
    the latest such time and the zone's (provider, region)."""
    rows = session.exec(
        select(Attempt.zone, Attempt.provider, Attempt.region, func.max(Attempt.ended_at))
        .where(*_refusals(now, hours), Attempt.market == "spot")
        .group_by(col(Attempt.zone), col(Attempt.provider), col(Attempt.region))
    ).all()
    return {zone: (at, (provider, region)) for zone, provider, region, at in rows if at is not None}


def _refusals(now: datetime, hours: float) -> tuple[ColumnElement[bool], ...]:
    return (
        col(Attempt.ended_at) >= now - timedelta(hours=hours),
        col(Attempt.end_reason).in_(("capacity", "preempted")),
    )


def spot_history(
    session: Session, now: datetime, days: float = policy.HISTORY_DAYS
) -> policy.AvailabilityHistory:
    """Spot availability per zone as the broker's own attempts saw it over the last days
    (``spot_model.spot_attempts``, read as ``attempt_sightings`` reads them, in hours, not a
    gang's node-hours: the policy reads a zone's current window's age off it)."""
    return policy.history_of(
        sighting
        for _, zone, _, _, end_reason, started, ended, _ in spot_model.spot_attempts(
            session, now, days
        )
        for sighting in attempt_sightings(zone, end_reason, started, ended, now)
    )
