"""Planning with what the database knows: quotes, re-plans, steering and calibration.

The pure planner (``broker.core.planner``), throughput model and policy
(``broker.core.policy``) do the thinking; this module feeds them the offers the broker may
launch, the job's remaining work, time and budget, the throughput corrections learnt from
earlier attempts and the spot history the broker has seen, and turns their answers into plans
an attempt can run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker.bundled import bundled_throughput_model
from broker.core import policy
from broker.core.errors import Infeasible, InvalidInput
from broker.core.money import format_usd, to_micros
from broker.core.offers import OfferTable
from broker.core.planner import Plan, PlanRequest, PlanSet, rank_plans
from broker.core.throughput import ThroughputModel, Workload, update_correction
from broker.db.engine import begin_write, is_postgres
from broker.db.models import Attempt, Job, PriceSnapshot, Team, ThroughputCorrection
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved, job_spent, team_budget
from broker.settings import Settings, get_settings
from pricing.catalog import bundled_catalog

log = logging.getLogger(__name__)

STARTUP_HOURS = 0.1  # launch + boot + setup before a restore starts
MIN_CALIBRATION_HOURS = 0.25  # attempts shorter than this (after restart) teach nothing
Steer = Literal["continue", "on_demand", "spot"]
REFUSED_HOURS = 1.0  # a zone that refused or preempted spot this recently is taken as out of it


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


@dataclass(frozen=True)
class Choice:
    """A plan an attempt can launch: its API fields, hourly price and worst-case cost."""

    plan: dict[str, Any]
    price_micros: int
    worst_case_micros: int


@dataclass(frozen=True)
class Replan:
    """Plans for a job's remaining work, or why there is none (``stop`` names the status)."""

    choices: list[Choice]
    stop: Literal["budget_exhausted", "deadline_missed"] | None = None
    reason: str | None = None


def launchable(
    offers: OfferTable, aws_regions: Iterable[str], gcp_zones: Iterable[str]
) -> OfferTable:
    """The offers in the AWS regions and GCP zones the broker is configured to launch in."""
    mask = ((offers.provider == "aws") & np.isin(offers.region, list(aws_regions))) | (
        (offers.provider == "gcp") & np.isin(offers.zone, list(gcp_zones))
    )
    return offers.take(np.flatnonzero(mask))


def corrections(session: Session) -> dict[tuple[str, str], float]:
    """Learnt throughput corrections per (model, GPU type)."""
    rows = session.exec(select(ThroughputCorrection)).all()
    return {(row.model, row.gpu): row.factor for row in rows}


def plan_request(spec: JobSpec, now: datetime, total_work: float, top_n: int = 20) -> PlanRequest:
    """Translate an API job spec into a :class:`PlanRequest` (deadline as hours from ``now``)."""
    r = spec.resources
    return PlanRequest(
        gpus=r.gpus,
        total_work=total_work,
        deadline_hours=(spec.deadline - now).total_seconds() / 3600.0,
        max_cost_micros=to_micros(spec.max_cost),
        gpu_types=tuple(r.gpu_types) if r.gpu_types is not None else None,
        min_gpu_memory_gb=r.min_gpu_memory_gb,
        providers=tuple(r.providers) if r.providers is not None else None,
        regions=tuple(r.regions) if r.regions is not None else None,
        vcpus_per_gpu=r.vcpus_per_gpu,
        ram_gb_per_gpu=r.ram_gb_per_gpu,
        market=spec.market,
        checkpoint_interval_hours=spec.checkpoint.interval_minutes / 60.0,
        checkpoint_size_gb=spec.checkpoint.size_gb,
        top_n=top_n,
    )


class Planning:
    """The offers the broker may launch and the throughput model, used by API and workers."""

    def __init__(
        self,
        offers: OfferTable,
        model: ThroughputModel,
        *,
        startup_hours: float = STARTUP_HOURS,
        settings: Settings | None = None,
    ) -> None:
        self.offers = offers
        self.model = model
        self.startup_hours = startup_hours
        self.settings = settings

    @classmethod
    def from_settings(cls, settings: Settings) -> Planning:
        """The bundled catalog cut to the configured regions and zones."""
        offers = launchable(bundled_catalog(), settings.aws_regions, settings.gcp_zones)
        return cls(offers, bundled_throughput_model(), settings=settings)

    def _model(self, learnt: Mapping[tuple[str, str], float] | None) -> ThroughputModel:
        if not learnt:
            return self.model
        known = {m.lower() for m in self.model.known_models()}
        return self.model.with_corrections(
            {k: v for k, v in learnt.items() if k[0].lower() in known}
        )

    def _rates(self, spec: JobSpec, model: ThroughputModel, mask: np.ndarray) -> np.ndarray:
        workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
        rates = np.zeros(len(self.offers))
        if mask.any():
            count = self.offers.gpu_count[mask]
            rates[mask] = model.work_per_hour(
                workload,
                self.offers.gpu[mask],
                count,
                self.offers.vcpus[mask] / count,
                self.offers.ram_gb[mask] / count,
            )
        return rates

    def quote(
        self,
        spec: JobSpec,
        now: datetime,
        *,
        learnt: Mapping[tuple[str, str], float] | None = None,
        work_left: float | None = None,
        budget_micros: int | None = None,
        market: str | None = None,
        exclude_zones: Iterable[str] = (),
        top_n: int = 20,
    ) -> PlanSet:
        """Ranked plans for ``spec`` (or what is left of it) at ``now``."""
        try:
            request = plan_request(spec, now, spec.total_work, top_n)
        except ValueError as error:
            raise InvalidInput(str(error), "workload") from None
        if work_left is not None:
            request = replace(request, total_work=max(work_left, 1e-9))
        if budget_micros is not None:
            request = replace(request, max_cost_micros=budget_micros)
        if market is not None:
            request = replace(request, market=market)
        from broker.core.planner import resource_mask

        mask = resource_mask(request, self.offers)
        excluded = list(exclude_zones)
        if excluded:
            mask &= ~np.isin(self.offers.zone, excluded)
        try:
            rates = self._rates(spec, self._model(learnt), mask)
        except ValueError as error:
            raise InvalidInput(str(error), "workload") from None
        return rank_plans(request, self.offers, rates, self.startup_hours)

    # -- the running broker --------------------------------------------------------------

    def plans_for_job(
        self,
        session: Session,
        job: Job,
        now: datetime,
        *,
        market: str | None = None,
        exclude_zones: Iterable[str] = (),
    ) -> Replan:
        """Plans for the job's remaining work, time and budget (from its latest checkpoint).

        The budget is what the job may still spend: max_cost less its spend, and no more than
        its reservation plus what its team has free. Zones in ``exclude_zones`` (recent
        capacity errors, preemptions) are left out unless nothing else fits.
        """
        spec = JobSpec.model_validate(job.spec)
        spent = job_spent(session, job.id)
        team = session.get(Team, job.team_id)
        assert team is not None
        free = team_budget(session, team, now).available
        budget = min(job.max_cost_micros - spent, job_reserved(session, job.id) + max(free, 0))
        if budget <= 0:
            return Replan([], "budget_exhausted", "no budget left for another attempt")
        market = market or job.market
        work_left = job.total_work - job.checkpointed_work
        learnt = corrections(session)
        plans = self.quote(
            spec,
            now,
            learnt=learnt,
            work_left=work_left,
            budget_micros=budget,
            market=market,
            exclude_zones=exclude_zones,
        )
        if not plans.plans and exclude_zones:
            plans = self.quote(
                spec, now, learnt=learnt, work_left=work_left, budget_micros=budget, market=market
            )
        if plans.plans:
            return Replan(
                [
                    Choice(plan_fields(p), p.price_per_hour_micros, p.worst_case_cost_micros)
                    for p in plans.plans
                ]
            )
        why = plans.infeasible_reason
        if why is not None and why.reason == "over_budget":
            return Replan([], "budget_exhausted", f"remaining budget too small: {why.message}")
        return Replan([], "deadline_missed", why.message if why else "no plan fits")

    def market_now(
        self, session: Session, job: Job, now: datetime, tick_hours: float
    ) -> str | None:
        """The market the policy wants for a job with nothing running (None: the plan's).

        ``policy.decide`` with no instance: spot while it is safe; on-demand when the plan
        says so, or once waiting any longer would put the deadline at risk. The simulated
        broker may also wait for spot to come back; live, the broker sees spot only by
        launching, so when every zone it knows has refused or preempted spot lately
        (``refused_zones``) it starts on-demand rather than wait blind, and ``steer`` moves
        the job back to spot once a refusal has aged out and the plan still wants spot.
        """
        if job.market != "auto":
            return None
        state = self._state(session, job, None, now, tick_hours)
        if state is None:
            return None
        decision = policy.decide(state)
        if decision.action == policy.Action.ON_DEMAND or not any(state.spot_obtainable):
            return "on_demand"
        return None

    def steer(
        self, session: Session, job: Job, attempt: Attempt, now: datetime, tick_hours: float
    ) -> Steer:
        """Keep a running attempt, or switch its market when the plan or the deadline says so.

        ``policy.decide`` (the ``broker`` policy the simulator measures) may move a spot job
        to on-demand. In the simulator progress is exactly as planned, so a spot job's slack
        never shrinks while it runs. Live, a slower GPU than predicted, or work since the
        last checkpoint that a preemption would lose, does shrink it, so a spot attempt whose
        slack (from the latest checkpoint) no longer covers one restart plus a tick moves to
        on-demand now, while it still can.

        A move is only worth it when an on-demand plan can still meet the deadline (and fit
        the budget) from the latest checkpoint. When none can but the running instance, with
        the work it did since, can still finish in time, it is the job's only chance: keep it.

        An on-demand attempt of an ``auto`` job moves back to spot when the policy says so
        (``_back_to_spot``), as the simulated broker does once spot returns.
        """
        if attempt.market == "on_demand":
            return self._back_to_spot(session, job, attempt, now, tick_hours)
        if job.market == "spot":
            return "continue"
        state = self._state(session, job, attempt, now, tick_hours)
        if state is None:
            return "continue"
        move = state.slack_hours - state.tick_hours < state.restart_hours
        if not move:
            move = policy.decide(state).action == policy.Action.ON_DEMAND
        if not move:
            return "continue"
        if self.plans_for_job(session, job, now, market="on_demand").choices:
            return "on_demand"
        work_per_hour = job.total_work / state.work_total_hours
        finish_hours = max(job.total_work - job.work_done, 0.0) / work_per_hour
        return "continue" if finish_hours <= state.hours_to_deadline else "on_demand"

    def _back_to_spot(
        self, session: Session, job: Job, attempt: Attempt, now: datetime, tick_hours: float
    ) -> Steer:
        """Spot when the policy would leave on-demand for spot in a zone that has not
        refused or preempted spot lately, a spot plan fits what is left, and the move loses
        at most a tick's work (the work since the latest checkpoint; else it waits for one).
        """
        if job.market != "auto":
            return "continue"
        state = self._state(session, job, attempt, now, tick_hours)
        if state is None or policy.decide(state).action != policy.Action.SPOT:
            return "continue"
        work_per_hour = job.total_work / state.work_total_hours
        if (job.work_done - job.checkpointed_work) / work_per_hour > tick_hours:
            return "continue"
        spot = self.plans_for_job(
            session, job, now, market="spot", exclude_zones=refused_zones(session, now)
        )
        return "spot" if spot.choices else "continue"

    def _rate(self, session: Session, job: Job, gpu: str, count: int) -> float:
        spec = JobSpec.model_validate(job.spec)
        workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
        model = self._model(corrections(session))
        return float(model.work_per_hour(workload, np.array([gpu]), np.array([count]))[0])

    def restart_hours(self, job: Job) -> float:
        """Start-up plus restoring the job's checkpoint."""
        checkpoint = job.spec.get("checkpoint", {})
        size = float(checkpoint.get("size_gb", 5.0))
        return self.startup_hours + size * 10.0 / 3600.0

    def _state(
        self,
        session: Session,
        job: Job,
        attempt: Attempt | None,
        now: datetime,
        tick_hours: float,
    ) -> policy.PolicyState | None:
        plan = job.plan or {}
        gpu = attempt.gpu if attempt else plan.get("gpu")
        count = attempt.gpu_count if attempt else plan.get("gpu_count")
        if not gpu or not count:
            return None
        rate = self._rate(session, job, gpu, int(count))
        if rate <= 0:
            return None
        restart = self.restart_hours(job)
        restart_left = 0.0
        instance = policy.Instance.NONE
        if attempt is not None:
            instance = (
                policy.Instance.SPOT if attempt.market == "spot" else policy.Instance.ON_DEMAND
            )
            if attempt.work_done <= attempt.work_at_start and attempt.started_at is not None:
                ran = (now - attempt.started_at).total_seconds() / 3600
                restart_left = max(restart - ran, 0.0)
        history = spot_history(session, now)
        zones = tuple(z for z in history.zones) or (plan.get("zone", ""),)
        refused = refused_zones(session, now)
        running_spot = attempt.zone if attempt is not None and attempt.market == "spot" else None
        return policy.PolicyState(
            hours_to_deadline=(job.deadline - now).total_seconds() / 3600,
            hours_total=(job.deadline - job.created_at).total_seconds() / 3600,
            work_left_hours=(job.total_work - job.checkpointed_work) / rate,
            work_total_hours=job.total_work / rate,
            restart_hours=restart,
            restart_left_hours=restart_left,
            tick_hours=tick_hours,
            instance=instance,
            zone=running_spot,
            zones=zones,
            spot_obtainable=tuple(z == running_spot or z not in refused for z in zones),
            history=history,
        )

    # -- learning ------------------------------------------------------------------------

    def calibrate(self, session: Session, attempt_id: str) -> float | None:
        """Fold an ended attempt's observed speed into its (model, GPU) correction.

        Speed = work the attempt did / its running hours after the restart overhead, against
        the uncorrected prediction for its GPU; attempts too short to say are skipped.
        Returns the new factor, or None when nothing was learnt.
        """
        begin_write(session)  # reads then a write: on SQLite take the write lock first
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is None or job is None or attempt.started_at is None or attempt.ended_at is None:
            session.rollback()
            return None
        model_name = job.spec.get("workload", {}).get("model")
        if not model_name:
            session.rollback()
            return None
        hours = (attempt.ended_at - attempt.started_at).total_seconds() / 3600
        hours -= self.restart_hours(job)
        work = attempt.work_done - attempt.work_at_start
        if hours < MIN_CALIBRATION_HOURS or work <= 0:
            session.rollback()
            return None
        spec = JobSpec.model_validate(job.spec)
        workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
        predicted = float(
            self.model.work_per_hour(
                workload, np.array([attempt.gpu]), np.array([attempt.gpu_count])
            )[0]
        )
        statement = select(ThroughputCorrection).where(
            ThroughputCorrection.model == model_name, ThroughputCorrection.gpu == attempt.gpu
        )
        if is_postgres(session):
            statement = statement.with_for_update()
        row = session.exec(statement).first()
        if row is None:
            row = ThroughputCorrection(
                model=model_name, gpu=attempt.gpu, factor=1.0, observations=0
            )
        row.factor = update_correction(row.factor, predicted, work / hours, row.observations)
        row.observations += 1
        row.updated_at = attempt.ended_at
        session.add(row)
        session.commit()
        log.info(
            "throughput calibrated",
            extra={"model": model_name, "gpu": attempt.gpu, "factor": round(row.factor, 4)},
        )
        return row.factor

    def refresh(self, engine: Engine, now: datetime) -> dict[str, Any]:
        """Refresh spot prices from the configured clouds; a failure keeps the last table."""
        from pricing.refresh import refresh_aws, refresh_gcp

        settings = self.settings or get_settings()
        results: dict[str, Any] = {}
        for source, run in (
            (
                "aws",
                lambda table: refresh_aws(
                    table,
                    now,
                    session=_boto_session(settings),
                    endpoint_url=settings.aws_endpoint_url,
                    regions=settings.aws_regions,
                ),
            ),
            (
                "gcp",
                lambda table: refresh_gcp(
                    table, now, settings.gcp_project, endpoint_url=settings.gcp_endpoint_url
                ),
            ),
        ):
            try:
                result = run(self.offers)
                error = result.error
            except Exception as failure:  # the last good table stays
                result, error = None, f"{type(failure).__name__}: {failure}"
            if result is not None and error is None:
                self.offers = result.table
            if error:
                log.warning("price refresh from %s failed, keeping last prices: %s", source, error)
            with Session(engine) as session:
                session.add(
                    PriceSnapshot(source=source, taken_at=now, offers=len(self.offers), error=error)
                )
                session.commit()
            results[source] = error or "ok"
        return results


def _boto_session(settings: Settings) -> Any:
    import boto3

    secret = settings.aws_secret_access_key
    return boto3.session.Session(
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        region_name=settings.aws_region,
    )


def refused_zones(session: Session, now: datetime, job_id: str | None = None) -> set[str]:
    """Zones that refused a launch (capacity) or preempted an instance within
    ``REFUSED_HOURS``: any job's spot attempts, or with ``job_id`` that job's attempts."""
    query = select(Attempt.zone).where(
        col(Attempt.ended_at) >= now - timedelta(hours=REFUSED_HOURS),
        col(Attempt.end_reason).in_(("capacity", "preempted")),
    )
    if job_id is None:
        query = query.where(Attempt.market == "spot")
    else:
        query = query.where(Attempt.job_id == job_id)
    return set(session.exec(query).all())


def spot_history(
    session: Session, now: datetime, days: float = policy.HISTORY_DAYS
) -> policy.AvailabilityHistory:
    """Spot availability per zone as the broker's own attempts saw it over the last days.

    A spot attempt's running time counts as available; one preemption ends a window; a
    capacity refusal counts as a short unavailable observation.
    """
    since = now - timedelta(days=days)
    attempts = session.exec(
        select(Attempt)
        .where(Attempt.market == "spot", col(Attempt.created_at) >= since)
        .order_by(col(Attempt.created_at))
    ).all()
    history = policy.AvailabilityHistory()
    for attempt in attempts:
        if attempt.end_reason == "capacity":
            history = history.observe(attempt.zone, False, 0.1)
        elif attempt.started_at is not None:
            end = attempt.ended_at or now
            hours = max((end - attempt.started_at).total_seconds() / 3600, 0.0)
            history = history.observe(attempt.zone, True, hours)
            if attempt.end_reason == "preempted":
                history = history.observe(attempt.zone, False, 0.0)
    return history


@lru_cache
def get_planning() -> Planning:
    """The process-wide planning, from settings."""
    return Planning.from_settings(get_settings())


def quote_job(spec: JobSpec, now: datetime, session: Session | None = None) -> PlanSet:
    """Ranked plans for ``spec`` at ``now``; Infeasible (422) when none fits, with why."""
    if spec.deadline <= now:
        raise InvalidInput(f"deadline {spec.deadline.isoformat()} is in the past", "deadline")
    learnt = corrections(session) if session is not None else None
    plans = get_planning().quote(spec, now, learnt=learnt)
    if not plans.plans:
        reason = plans.infeasible_reason
        raise Infeasible(reason.message if reason else "no plan meets the deadline and max_cost")
    return plans
