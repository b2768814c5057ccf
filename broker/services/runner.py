"""Drives jobs through the clouds: launch, observe, steer, clean up. Celery tasks call it.

Every database change goes through one ``lifecycle`` function; cloud calls happen between
them, never inside a transaction: an attempt is committed before its launch (its id is the
launch's idempotency token) and ended before its instance is terminated. The plans come from
``quoting``, the decision to switch market from ``steering``; the runner carries them out and
hands ended attempts to ``calibration``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker import clock
from broker.core.errors import BudgetExceeded
from broker.core.job_status import JobStatus, is_terminal
from broker.db.engine import open_session
from broker.db.models import Attempt, Job
from broker.faults import fault_point
from broker.services import lifecycle
from broker.services.launch_request import agent_token, launch_request
from broker.services.lifecycle import LAUNCHING, RUNNING, ToTerminate
from broker.services.metrics import PROVIDER_ERRORS
from broker.services.plans import ChosenPlan, job_plan
from broker.services.quoting import Planning
from broker.services.reconcile import ReconcileReport, reconcile
from broker.services.reservations import job_reservation
from broker.services.spend_control import SpendControls, live_counts, may_launch
from broker.services.steering import market_now, refused_zones
from broker.services.watching import Watching
from providers.base import (
    CapacityError,
    InstanceRef,
    Provider,
    ProviderError,
    QuotaError,
    TransientError,
)

log = logging.getLogger(__name__)

# Jobs a tick launches when they have no live attempt (running too: a crash can leave a job
# marked running after its attempt ended; launching again resumes it from its checkpoint).
WAITING = (
    JobStatus.QUEUED.value,
    JobStatus.PREEMPTED.value,
    JobStatus.PROVISIONING.value,
    JobStatus.RUNNING.value,
)


@dataclass
class TickReport:
    """What one tick found to do."""

    observe: list[str] = field(default_factory=list)
    launch: list[str] = field(default_factory=list)


class Runner(Watching):
    """The broker's hands: launches plans, watches attempts, stops and cleans up."""

    def __init__(
        self,
        engine: Engine,
        providers: Mapping[str, Provider],
        planning: Planning,
        *,
        agent_secret: str,
        api_url: str,
        tick_seconds: float,
        checkpoint_bucket: str = "broker-checkpoints",
        controls: SpendControls | None = None,
        agent_silence_seconds: float = 600.0,
        agent_boot_grace_seconds: float = 600.0,
        agent_report_seconds: float = 60.0,
        reconcile_min_age_seconds: float = 600.0,
    ) -> None:
        self.engine = engine
        self.providers = dict(providers)
        self.planning = planning
        self.agent_secret = agent_secret
        self.api_url = api_url
        self.tick_seconds = tick_seconds
        self.checkpoint_bucket = checkpoint_bucket
        self.controls = controls or SpendControls()
        # Broker seconds an agent may be silent before its attempt is lost (settings'
        # agent_silence_seconds); before its first call it has the boot grace on top.
        self.agent_silence_seconds = agent_silence_seconds
        self.agent_boot_grace_seconds = agent_boot_grace_seconds
        self.agent_report_seconds = agent_report_seconds
        # Broker seconds an unknown tagged instance must have run before reconcile ends it.
        self.reconcile_min_age_seconds = reconcile_min_age_seconds

    def _session(self) -> Session:
        return open_session(self.engine)

    # -- launching ------------------------------------------------------------------------

    def launch_urgent_first(self, job_id: str) -> str | None:
        """Admission's launch of a job: the waiting job with the least slack (the earliest
        ``Job.start_by``), when it must start before this one and nothing launches it yet,
        goes first. Admission enqueues its
        launches in submission order; a burst of them (a queue of launches each taking a
        second) would otherwise start a tight job last. Returns this job's attempt id."""
        urgent = self._more_urgent(job_id)
        if urgent is not None:
            self.launch(urgent)
        return self.launch(job_id)

    def launch_admitted(self, job_ids: Iterable[str]) -> list[str]:
        """Admission's launches of several jobs (``launch_urgent_first`` each, in order); a
        transient cloud error stops only its job's launch. Returns those jobs' ids, for a
        retry of their own."""
        return self._launch_each(job_ids, self.launch_urgent_first)

    def launch_due(self, job_ids: Iterable[str]) -> list[str]:
        """The tick's launches of waiting jobs, in the order it gave them (``due``: least
        slack first); a transient cloud error stops only its job's launch, which a later
        tick tries again. Returns those jobs' ids."""
        return self._launch_each(job_ids, self.launch)

    @staticmethod
    def _launch_each(job_ids: Iterable[str], launch: Callable[[str], str | None]) -> list[str]:
        failed = []
        for job_id in job_ids:
            try:
                launch(job_id)
            except TransientError as error:
                log.warning("launch failed, will retry: %s", error, extra={"job_id": job_id})
                failed.append(job_id)
        return failed

    def _more_urgent(self, job_id: str) -> str | None:
        """The waiting job, without a live attempt and within the live-attempt limits, with
        the earliest ``start_by`` before ``job_id``'s, if any."""
        with self._session() as session:
            job = session.get(Job, job_id)
            if job is None:
                return None
            live = select(Attempt.job_id).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
            row = session.exec(
                select(Job.id, Job.team_id)
                .where(
                    col(Job.status).in_(WAITING),
                    _start_by() < (job.start_by or job.deadline),
                    col(Job.id).not_in(live),
                )
                .order_by(_start_by(), col(Job.id))
                .limit(1)
            ).first()
            if row is None or not may_launch(self.controls, live_counts(session), row[1]):
                return None
            return row[0]

    def launch(
        self,
        job_id: str,
        market: str | None = None,
        exclude_zones: Iterable[str] = (),
        replacing: str | None = None,
    ) -> str | None:
        """Launch the job's next plan (or finish a launch under way); returns the attempt id.
        Zones the job refused lately and ``exclude_zones`` are left out unless nothing else
        fits. ``replacing``: the job's running attempt to replace (``_replace``)."""
        if replacing is not None:
            return self._replace(job_id, replacing, market or "spot", exclude_zones)
        with self._session() as session:
            job = session.get(Job, job_id)
            if job is None or is_terminal(job.status):
                return None
            live = lifecycle.live_attempts(session, job_id)
            if live:
                attempt = live[0]
                if attempt.status == LAUNCHING:
                    # A launch that a crash interrupted: the same token finds the same instance.
                    return self._launch_attempt(session, job, attempt)
                return None
            now = clock.now()
            if lifecycle.work_complete(job):
                self._terminate(
                    lifecycle.stop(
                        session, job_id, JobStatus.SUCCEEDED, "work reached (checkpointed)", now
                    )
                )
                return None
            if now >= job.deadline:
                self._terminate(
                    lifecycle.stop(
                        session,
                        job_id,
                        JobStatus.DEADLINE_MISSED,
                        "deadline passed before a launch",
                        now,
                    )
                )
                return None
            self.planning.sync(session)
            market = market or market_now(self.planning, session, job, now, self.tick_hours)
            excluded, tries = set(exclude_zones), 1
            if market == "wait":
                # The policy waits for spot where none was to be had lately: as the simulated
                # broker keeps a spot request open, ask once a tick for the best spot plan,
                # refused zones included (a refusal costs nothing and is no launch failure),
                # and never fall back to on-demand here: a later tick asks the policy again.
                log.info("waiting for spot: asking for it this tick", extra={"job_id": job_id})
            else:
                excluded |= refused_zones(session, now, job_id, market=market)
                tries = 3
            replan = self.planning.plans_for_job(
                session,
                job,
                now,
                market="spot" if market == "wait" else market,
                exclude_zones=excluded,
            )
            if replan.stop is not None and job.market == "auto" and market in ("wait", "spot"):
                # The policy would wait for spot, or take it, but no spot plan meets the
                # deadline any more: an auto job stops only when on-demand cannot either.
                market, tries = "on_demand", 3
                excluded = set(exclude_zones) | refused_zones(session, now, job_id, market=market)
                replan = self.planning.plans_for_job(
                    session, job, now, market=market, exclude_zones=excluded
                )
            if replan.stop is not None:
                self._terminate(
                    lifecycle.stop(
                        session, job_id, JobStatus(replan.stop), replan.reason or "", now
                    )
                )
                return None
            if not may_launch(self.controls, live_counts(session), job.team_id):
                return None  # the job waits (queued or preempted) for a free slot
            tried: set[tuple[str, str, str, int]] = set()
            for choice in self._choices(session, job, now, replan.choices[:tries], market):
                offer = (choice.zone, choice.instance_type, choice.market, choice.nodes)
                if offer in tried:
                    continue
                tried.add(offer)
                try:
                    begun = self._begin(session, job, choice, now)
                except BudgetExceeded as error:
                    self._terminate(
                        lifecycle.stop(session, job_id, JobStatus.BUDGET_EXHAUSTED, str(error), now)
                    )
                    return None
                if begun is None:
                    return None
                attempt, _ = begun
                launched = self._launch_attempt(session, job, attempt)
                if launched is not None:
                    return launched
                session.refresh(job)
                if is_terminal(job.status):
                    return None
            return None

    def _begin(
        self,
        session: Session,
        job: Job,
        choice: ChosenPlan,
        now: datetime,
        replacing: str | None = None,
    ) -> tuple[Attempt, str] | None:
        """``lifecycle.begin_attempt`` on ``choice``, with the agent's token and what the
        budget net needs of the work left on this plan: no more, or the job would outgrow
        its admission's tight reservation."""
        return lifecycle.begin_attempt(
            session,
            job.id,
            choice,
            now,
            token_for=lambda attempt_id: agent_token(self.agent_secret, attempt_id, job.deadline),
            reserve_up_to=job_reservation(
                self.planning, session, job, choice, now, self.tick_hours, factor=0.0
            ),
            replacing=replacing,
        )

    def _replace(
        self, job_id: str, running: str, market: str, exclude_zones: Iterable[str]
    ) -> str | None:
        """Make before break: launch the job on ``market`` while its ``running`` attempt goes
        on, which ends only once the new instance runs (``lifecycle.launch_succeeded``).
        The best plans on that market outside ``exclude_zones`` and the zones refused lately
        are tried in turn; when the cloud refuses them all, or the job may not launch now
        (its budget, no plan), the running attempt simply goes on and nothing is lost:
        the simulator's move (``broker.sim.simulator._apply``). Returns the new attempt's id."""
        with self._session() as session:
            job = session.get(Job, job_id)
            if job is None or is_terminal(job.status):
                return None
            now = clock.now()
            if now >= job.deadline:
                return None
            self.planning.sync(session)
            excluded = set(exclude_zones) | refused_zones(session, now, job_id, market=market)
            replan = self.planning.plans_for_job(
                session, job, now, market=market, exclude_zones=excluded
            )
            for choice in [c for c in replan.choices[:3] if c.zone not in excluded]:
                try:
                    begun = self._begin(session, job, choice, now, replacing=running)
                except BudgetExceeded:
                    return None  # the running attempt goes on; the policy asks again
                if begun is None:
                    return None
                launched = self._launch_attempt(session, job, begun[0], plan=choice)
                if launched is not None:
                    return launched
            return None

    def _choices(
        self,
        session: Session,
        job: Job,
        now: datetime,
        choices: list[ChosenPlan],
        market: str | None,
    ) -> Iterator[ChosenPlan]:
        """The plans one launch tries in turn: admission's first plan (on a first launch),
        the re-plan's best; then, for an ``auto`` job whose spot launches were all refused,
        the best on-demand plan (computed only then) unless the policy, knowing those
        refusals, would rather wait for spot (``steering.market_now``). A job waiting for
        spot (``market`` "wait") tries the spot plans given, nothing else."""
        if market == "wait":
            yield from choices
            return
        yield from (p for p in self._first_plan(session, job) if market in (None, p.market))
        yield from choices
        if job.market == "auto" and market != "on_demand":
            # with those refusals known, the policy may rather wait for spot
            if market_now(self.planning, session, job, clock.now(), self.tick_hours) == "wait":
                return
            on_demand = self.planning.plans_for_job(session, job, now, market="on_demand")
            yield from on_demand.choices[:1]

    def _first_plan(self, session: Session, job: Job) -> list[ChosenPlan]:
        """The plan admission chose and showed, for a job's first launch."""
        plan = job_plan(job)
        if plan is None or session.exec(select(Attempt.id).where(Attempt.job_id == job.id)).first():
            return []
        return [plan]

    @property
    def lease_seconds(self) -> float:
        """The spend lease an attempt is granted at each renewal (broker seconds; ticks at
        the clock's starting scale, so a lowered scale lengthens it in wall time)."""
        return self.controls.lease(self.tick_seconds * clock.nominal_scale())

    @property
    def tick_hours(self) -> float:
        """Broker-clock hours between two ticks."""
        return self.tick_seconds * clock.scale() / 3600

    def _launch_attempt(
        self, session: Session, job: Job, attempt: Attempt, plan: ChosenPlan | None = None
    ) -> str | None:
        """Launch the attempt's instance, or a gang's nodes 0..N-1 in turn (each recorded as
        it returns, each with its own idempotency token, so a retry finds the same ones);
        a refusal of any node ends the attempt and terminates the nodes already started.
        ``plan``: the plan the attempt was begun on (a replacing attempt's becomes the job's
        once it runs)."""
        provider = self.providers[attempt.provider]
        first: str | None = None
        for rank in range(attempt.nodes):
            request = launch_request(
                job, attempt, api_url=self.api_url, agent_secret=self.agent_secret, node_rank=rank
            )
            try:
                ref = provider.launch(request)
            except TransientError:
                PROVIDER_ERRORS.labels(attempt.provider, "transient").inc()
                raise  # the adapter already retried; let the task retry the same attempt later
            except ProviderError as error:
                self._launch_refused(session, job, attempt, rank, error)
                return None
            if attempt.nodes > 1:
                late = lifecycle.node_launched(
                    session, attempt.id, rank, ref.instance_id, clock.now()
                )
                if late:  # the attempt ended meanwhile (a cancel, a stop)
                    self._terminate(late)
                    return None
                if rank < attempt.nodes - 1:
                    fault_point("between_nodes")
            first = first or ref.instance_id
        assert first is not None
        fault_point("after_launch")
        self._terminate(
            lifecycle.launch_succeeded(
                session, attempt.id, first, clock.now(), lease_seconds=self.lease_seconds, plan=plan
            )
        )
        log.info(
            "attempt running",
            extra={
                "job_id": job.id,
                "attempt_id": attempt.id,
                "zone": attempt.zone,
                "market": attempt.market,
                "nodes": attempt.nodes,
            },
        )
        return attempt.id

    def _launch_refused(
        self, session: Session, job: Job, attempt: Attempt, rank: int, error: ProviderError
    ) -> None:
        """End an attempt whose launch (of node ``rank``) the cloud refused, then terminate
        the nodes of its gang that did start: no partial gang is left running."""
        if isinstance(error, CapacityError):
            reason, label = "capacity", "capacity"
        elif isinstance(error, QuotaError):
            reason, label = "quota", "quota"
        else:
            reason, label = "failed", "other"
        PROVIDER_ERRORS.labels(attempt.provider, label).inc()
        started = lifecycle.attempt_instances(session, attempt)
        lifecycle.launch_failed(session, attempt.id, reason, clock.now())
        self._terminate(started)
        where = {"job_id": job.id, "attempt_id": attempt.id, "zone": attempt.zone, "node": rank}
        if reason == "capacity":
            log.info("no capacity: %s", error, extra=where)
        else:
            log.warning("launch %s: %s", reason, error, extra=where)

    # -- watching -------------------------------------------------------------------------

    def due(self) -> TickReport:
        """The attempts to observe (nearest their lease's end first) and the jobs to launch
        at this tick (least slack first: the earliest ``Job.start_by``, then id, within the
        live-attempt limits), so a tight job is not stuck behind loose ones while many start
        at once."""
        report = TickReport()
        with self._session() as session:
            live = session.exec(
                select(Attempt.id, Attempt.job_id, Attempt.team_id)
                .where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
                .order_by(col(Attempt.lease_until).asc().nulls_first(), col(Attempt.id))
            ).all()
            report.observe = [attempt_id for attempt_id, _, _ in live]
            busy = {job_id for _, job_id, _ in live}
            counts = dict(Counter(team_id for _, _, team_id in live))  # as live_counts
            waiting = session.exec(
                select(Job.id, Job.team_id)
                .where(col(Job.status).in_(WAITING))
                .order_by(_start_by(), col(Job.id))
            ).all()
            for job_id, team_id in waiting:
                if job_id not in busy and may_launch(self.controls, counts, team_id):
                    report.launch.append(job_id)
                    counts[team_id] = counts.get(team_id, 0) + 1
        return report

    def cancel(self, team_id: str, job_id: str) -> None:
        """Cancel a team's job and terminate its instances now (reconcile catches misses)."""
        with self._session() as session:
            self._terminate(lifecycle.cancel(session, team_id, job_id, clock.now()))

    def terminate(self, instances: list[ToTerminate]) -> None:
        """Terminate ended attempts' instances; a failure is left to reconcile."""
        self._terminate(instances)

    def _terminate(self, instances: list[ToTerminate]) -> None:
        for item in instances:
            ref = InstanceRef(item.provider, item.region, item.zone, item.instance_id)
            try:
                self.providers[item.provider].terminate(ref)
            except ProviderError as error:
                # The attempt is already ended in the database: reconcile terminates it later.
                log.warning(
                    "terminate failed, left to reconcile: %s",
                    error,
                    extra={"attempt_id": item.attempt_id},
                )

    def reconcile(self) -> ReconcileReport:
        """Terminate orphans; mark attempts whose instance is gone (``services.reconcile``)."""
        return reconcile(
            self.engine, self.providers, min_age_seconds=self.reconcile_min_age_seconds
        )


def _start_by() -> ColumnElement[datetime]:
    """A job's latest on-time start (its deadline for a job admitted before it was kept)."""
    return func.coalesce(col(Job.start_by), col(Job.deadline))
