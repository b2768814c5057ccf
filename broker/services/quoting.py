"""Quotes and re-plans: ranked plans for a job spec, or for what is left of a running job.

The pure planner (``broker.core.planner``) and the throughput model do the thinking; this
module feeds them the offers the broker may launch (``Planning``), the job's work, deadline
and budget, and the throughput corrections learnt from earlier attempts
(``broker.services.calibration``). Steering (``broker.services.steering``), calibration and
the price refresh (``broker.services.price_refresh``) work on the same ``Planning``.

``Planning.offers`` is the bundled snapshot overlaid with the newest stored prices
(``broker.services.market_prices``); ``Planning.sync`` keeps it current in every process.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from functools import lru_cache

import numpy as np
from sqlmodel import Session, select

from broker import clock
from broker.bundled import bundled_throughput_model
from broker.core.errors import Infeasible, InvalidInput
from broker.core.money import to_micros
from broker.core.offers import OfferTable, overlay
from broker.core.planner import PlanRequest, PlanSet, plan_nodes, rank_plans
from broker.core.policy import AvailabilityHistory, ZoneHistory
from broker.core.throughput import ThroughputModel, Workload
from broker.db.models import Job, Team, ThroughputCorrection
from broker.services import spot_model
from broker.services.job_spec import JobSpec, ReferenceWorkload
from broker.services.ledger import job_reserved, job_spent, team_budget
from broker.services.market_prices import PriceRow, latest, price_rows, version
from broker.services.plans import ChosenPlan, Replan, job_plan
from broker.settings import Settings, get_settings
from pricing.catalog import bundled_catalog
from pricing.spot_prior import Key

STARTUP_HOURS = 0.1  # launch + boot + setup before a restore starts
MIN_WORK_GPU_HOURS = 0.01  # the smallest job admitted: 36 s of one reference GPU
RATE_CACHE_ENTRIES = 256  # throughput rates kept per offers table (workload shapes)


def launchable(
    offers: OfferTable, aws_regions: Iterable[str], gcp_zones: Iterable[str]
) -> OfferTable:
    """The offers in the AWS regions and GCP zones the broker is configured to launch in."""
    mask = ((offers.provider == "aws") & np.isin(offers.region, list(aws_regions))) | (
        (offers.provider == "gcp") & np.isin(offers.zone, list(gcp_zones))
    )
    return offers.take(np.flatnonzero(mask))


# Built once: read on every quote.
_CORRECTIONS = select(
    ThroughputCorrection.model, ThroughputCorrection.gpu, ThroughputCorrection.factor
)


def corrections(session: Session) -> dict[tuple[str, str], float]:
    """Learnt throughput corrections per (model, GPU type)."""
    return {(model, gpu): factor for model, gpu, factor in session.execute(_CORRECTIONS)}


def job_spec(job: Job) -> JobSpec:
    """The spec a job's re-plans use: its own, with a gang's shape pinned (``gpus`` per
    machine and ``nodes`` of the job's plan) once the planner chose one, so a gang restarts
    from its checkpoint on as many machines of as many GPUs as it was written for."""
    spec = JobSpec.model_validate(job.spec)
    plan = job_plan(job)
    if plan is None or plan.nodes <= 1 or spec.resources.nodes is not None:
        return spec
    resources = spec.resources.model_copy(update={"gpus": plan.gpu_count, "nodes": plan.nodes})
    return spec.model_copy(update={"resources": resources})


def plan_request(spec: JobSpec, now: datetime, total_work: float, top_n: int = 20) -> PlanRequest:
    """Translate an API job spec into a :class:`PlanRequest` (deadline as hours from ``now``)."""
    r = spec.resources
    return PlanRequest(
        gpus=r.gpus,
        nodes=r.nodes,
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
    """The offers the broker may launch and the throughput model, used by API and workers.

    ``base`` is the bundled launchable table; ``offers`` is ``base`` overlaid with the stored
    prices up to ``price_version`` (the highest price row id loaded). ``offers`` is swapped
    for a new table, never changed in place, so a reader keeps a consistent table.
    """

    def __init__(
        self,
        offers: OfferTable,
        model: ThroughputModel,
        *,
        startup_hours: float = STARTUP_HOURS,
        settings: Settings | None = None,
    ) -> None:
        self.base = offers
        self.offers = offers
        self.price_version = 0
        self.spot_version = -1  # the spot model's version behind offers.spot_risk; -1: none
        self.model = model
        self.startup_hours = startup_hours
        self.settings = settings
        self._lock = threading.Lock()
        self._checked_at = -math.inf  # time.monotonic() of the last version check
        self._rate_cache: tuple[OfferTable | None, dict[tuple[object, ...], np.ndarray]] = (
            None,
            {},
        )
        self._learnt: tuple[float, dict[tuple[str, str], float]] | None = None
        # the shared spot model's zone histories read so far, for the version they are of
        self._histories: tuple[int, dict[Key, ZoneHistory]] = (self.spot_version, {})

    def sync(self, session: Session, *, force: bool = False) -> bool:
        """Lay prices stored since the last sync over ``offers``, and the shared spot
        model's preemption rates (``spot_model.risk``) once it was refit; whether they changed.

        Reads the stored version at most once per ``price_check_seconds`` (wall, unless
        ``force``), and loads only rows newer than ``price_version``. A version below ours
        (the table was emptied) reloads every stored price over ``base``.
        """
        interval = (self.settings or get_settings()).price_check_seconds
        if not force and interval > 0 and time.monotonic() - self._checked_at < interval:
            return False
        with self._lock:
            checked = time.monotonic()
            if not force and interval > 0 and checked - self._checked_at < interval:
                return False  # another thread checked while this one waited
            self._checked_at = checked
            changed = rebuilt = False
            stored = version(session)
            if stored != self.price_version:
                start, table = (
                    (self.price_version, self.offers)
                    if stored > self.price_version
                    else (0, self.base)
                )
                observations, seen = latest(session, after_id=start)
                self.offers = overlay(table, observations)
                self.price_version, changed, rebuilt = seen, True, start == 0
            fitted = spot_model.version(session)
            if fitted != self.spot_version or rebuilt:
                offers = self.offers
                self.offers = offers.replace(spot_risk=spot_model.risk(session, offers))
                self.spot_version, changed = fitted, True
            return changed

    def learnt(self, session: Session) -> dict[tuple[str, str], float]:
        """The learnt throughput corrections (``corrections``), read again at most once per
        ``price_check_seconds`` (wall), as prices are; ``forget_learnt`` drops the copy."""
        interval = (self.settings or get_settings()).price_check_seconds
        kept = self._learnt
        if kept is not None and interval > 0 and time.monotonic() - kept[0] < interval:
            return kept[1]
        read_at = time.monotonic()
        learnt = corrections(session)
        self._learnt = (read_at, learnt)
        return learnt

    def spot_histories(self, session: Session, keys: Iterable[Key]) -> AvailabilityHistory:
        """``spot_model.history`` of these (provider, zone, family), each read once per
        version of the shared model (``spot_version``, which ``sync`` checks): a policy
        decision reads no rows its process already holds."""
        wanted = list(dict.fromkeys(keys))
        if self._histories[0] != self.spot_version:
            self._histories = (self.spot_version, {})
        kept = self._histories[1]
        missing = [key for key in wanted if key not in kept]
        if missing:
            read = spot_model.history(session, missing).zones
            kept.update((key, read[key[1]]) for key in missing)
        return AvailabilityHistory({key[1]: kept[key] for key in wanted})

    def forget_learnt(self) -> None:
        """Read the corrections again on next use (this process just changed one)."""
        self._learnt = None

    def forget_spot_histories(self) -> None:
        """Read the spot model's rows again on next use (its table was emptied or rewritten
        without a new version, as between tests)."""
        self._histories = (self.spot_version, {})

    @classmethod
    def from_settings(cls, settings: Settings) -> Planning:
        """The bundled catalog cut to the configured regions and zones."""
        offers = launchable(bundled_catalog(), settings.aws_regions, settings.gcp_zones)
        return cls(offers, bundled_throughput_model(), settings=settings)

    def prices(
        self,
        session: Session,
        *,
        gpu: str | None = None,
        provider: str | None = None,
        region: str | None = None,
        market: str | None = None,
    ) -> list[PriceRow]:
        """The current price of every launchable offer and market, filtered (see
        ``market_prices.price_rows``), after a sync with the stored prices."""
        self.sync(session)
        return price_rows(self.offers, gpu=gpu, provider=provider, region=region, market=market)

    def _model(self, learnt: Mapping[tuple[str, str], float] | None) -> ThroughputModel:
        if not learnt:
            return self.model
        known = {m.lower() for m in self.model.known_models()}
        return self.model.with_corrections(
            {k: v for k, v in learnt.items() if k[0].lower() in known}
        )

    def _rates(
        self,
        spec: JobSpec,
        model: ThroughputModel,
        offers: OfferTable,
        mask: np.ndarray,
        nodes: np.ndarray,
    ) -> np.ndarray:
        """Work per hour of each masked row's plan (the whole gang's, for a gang)."""
        workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
        rates = np.zeros(len(offers))
        if mask.any():
            count = offers.gpu_count[mask]
            rates[mask] = model.work_per_hour(
                workload,
                offers.gpu[mask],
                count,
                offers.vcpus[mask] / count,
                offers.ram_gb[mask] / count,
                nodes=nodes[mask],
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
        policy_fallback: bool = False,
    ) -> PlanSet:
        """Ranked plans for ``spec`` (or what is left of it) at ``now``; ``policy_fallback``:
        spot plans of an ``auto`` job whose policy keeps its deadline (``PlanRequest``)."""
        try:
            request = plan_request(spec, now, spec.total_work, top_n)
        except ValueError as error:
            raise InvalidInput(str(error), "workload") from None
        settings = self.settings or get_settings()
        request = replace(request, tick_hours=settings.tick_seconds * clock.scale() / 3600)
        if work_left is not None:
            request = replace(request, total_work=max(work_left, 1e-9))
        if budget_micros is not None:
            request = replace(request, max_cost_micros=budget_micros)
        if market is not None:
            request = replace(request, market=market)
        if policy_fallback:
            request = replace(request, policy_fallback=True)
        offers = self.offers  # one table for the whole quote, even if a sync swaps it
        nodes = plan_nodes(request, offers)
        mask = nodes > 0
        excluded = list(exclude_zones)
        if excluded:
            mask &= ~np.isin(offers.zone, excluded)
        try:
            rates = self._cached_rates(spec, learnt, offers, mask, nodes)
        except ValueError as error:
            raise InvalidInput(str(error), "workload") from None
        return rank_plans(request, offers, rates, self.startup_hours)

    def _cached_rates(
        self,
        spec: JobSpec,
        learnt: Mapping[tuple[str, str], float] | None,
        offers: OfferTable,
        mask: np.ndarray,
        nodes: np.ndarray,
    ) -> np.ndarray:
        """``_rates``, kept (read-only) per offers table, workload, corrections, mask and
        node counts: a sync swaps the table, which starts a new cache."""
        workload = spec.workload
        key = (
            type(workload).__name__,
            workload.model_dump_json(exclude_none=True),
            tuple(sorted(learnt.items())) if learnt else (),
            mask.tobytes(),
            nodes.tobytes(),
        )
        table, cache = self._rate_cache
        if table is not offers:
            cache = {}
            self._rate_cache = (offers, cache)
        rates = cache.get(key)
        if rates is None:
            rates = self._rates(spec, self._model(learnt), offers, mask, nodes)
            rates.flags.writeable = False
            if len(cache) >= RATE_CACHE_ENTRIES:
                cache.clear()
            cache[key] = rates
        return rates

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
        An ``auto`` job's spot plans (``market`` "spot") are its policy's: an offer needs
        only that its on-demand run fits the deadline (``PlanRequest.policy_fallback``).

        The budget is what the job may still spend: max_cost less its spend, and no more than
        its reservation plus what its team has free. Zones in ``exclude_zones`` (recent
        capacity errors, preemptions) are left out unless nothing else fits.
        """
        self.sync(session)
        spec = job_spec(job)
        spent = job_spent(session, job.id)
        team = session.get(Team, job.team_id)
        assert team is not None
        free = team_budget(session, team, now).available
        budget = min(job.max_cost_micros - spent, job_reserved(session, job.id) + max(free, 0))
        if budget <= 0:
            return Replan([], "budget_exhausted", "no budget left for another attempt")
        market = market or job.market
        # an auto job goes to spot when its policy says so, which keeps its deadline
        by_policy = market == "spot" and job.market == "auto"
        work_left = job.total_work - job.checkpointed_work
        learnt = self.learnt(session)
        plans = self.quote(
            spec,
            now,
            learnt=learnt,
            work_left=work_left,
            budget_micros=budget,
            market=market,
            exclude_zones=exclude_zones,
            policy_fallback=by_policy,
        )
        if not plans.plans and exclude_zones:
            plans = self.quote(
                spec,
                now,
                learnt=learnt,
                work_left=work_left,
                budget_micros=budget,
                market=market,
                policy_fallback=by_policy,
            )
        if plans.plans:
            return Replan([ChosenPlan.from_plan(p) for p in plans.plans])
        why = plans.infeasible_reason
        if why is not None and why.reason == "over_budget":
            return Replan([], "budget_exhausted", f"remaining budget too small: {why.message}")
        return Replan([], "deadline_missed", why.message if why else "no plan fits")

    def rate(self, session: Session, job: Job, gpu: str, count: int, nodes: int = 1) -> float:
        """The job's work per hour on ``nodes`` machines of ``count`` ``gpu``s, with the
        learnt corrections."""
        spec = JobSpec.model_validate(job.spec)
        workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
        model = self._model(self.learnt(session))
        rate = model.work_per_hour(
            workload, np.array([gpu]), np.array([count]), nodes=np.array([nodes])
        )
        return float(rate[0])

    def restart_hours(self, job: Job) -> float:
        """Start-up plus restoring the job's checkpoint."""
        checkpoint = job.spec.get("checkpoint", {})
        size = float(checkpoint.get("size_gb", 5.0))
        return self.startup_hours + size * 10.0 / 3600.0


@lru_cache
def get_planning() -> Planning:
    """The process-wide planning, from settings."""
    return Planning.from_settings(get_settings())


def warm_up(session: Session) -> None:
    """Build the process-wide planning and sync it with the stored prices, so that the
    first requests do not each build it (``lru_cache`` lets concurrent misses all build)."""
    get_planning().sync(session, force=True)


def check_size(planning: Planning, spec: JobSpec) -> None:
    """Refuse a job smaller than ``MIN_WORK_GPU_HOURS`` of one reference GPU (InvalidInput
    naming ``workload``): every instance bills a minute at least, so smaller work is mostly
    paying for nothing (and a flood of it is how a budget gets drained)."""
    workload = spec.workload
    if isinstance(workload, ReferenceWorkload):
        hours, gpu = workload.reference_gpu_hours, workload.reference_gpu
    else:
        gpu = "V100"
        try:
            load = Workload.from_mapping(workload.model_dump(exclude_none=True))
            rate = float(planning.model.work_per_hour(load, np.array([gpu]), np.array([1]))[0])
        except ValueError as error:  # an unknown model: say so, as a quote does
            raise InvalidInput(str(error), "workload") from None
        hours = load.total_work / rate if rate > 0 else math.inf
    if hours < MIN_WORK_GPU_HOURS:
        raise InvalidInput(
            f"the job is too small: {hours:.3g} GPU-hours of work on one {gpu}; the broker "
            f"takes jobs of at least {MIN_WORK_GPU_HOURS} GPU-hours (36 s), since every "
            "instance bills a minute at least",
            "workload",
        )


def quote_job(
    spec: JobSpec, now: datetime, session: Session | None = None, top_n: int = 20
) -> PlanSet:
    """The ``top_n`` best plans for ``spec`` at ``now`` (and the cheapest on-time on-demand
    one, whatever ``top_n``); InvalidInput (422) for a past deadline or a job too small to
    run, Infeasible (422) when no plan fits, with why."""
    if spec.deadline <= now:
        raise InvalidInput(f"deadline {spec.deadline.isoformat()} is in the past", "deadline")
    planning = get_planning()
    check_size(planning, spec)
    if session is not None:
        planning.sync(session)
    learnt = planning.learnt(session) if session is not None else None
    plans = planning.quote(spec, now, learnt=learnt, top_n=top_n)
    if not plans.plans:
        reason = plans.infeasible_reason
        raise Infeasible(reason.message if reason else "no plan meets the deadline and max_cost")
    return plans
