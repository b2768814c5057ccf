"""Drives jobs through the clouds: launch, observe, steer, clean up. Celery tasks call it.

Every database change goes through one ``lifecycle`` function; cloud calls happen between
them, never inside a transaction: an attempt is committed before its launch (its id is the
launch's idempotency token) and ended before its instance is terminated. The plans come from
``quoting``, the decision to switch market from ``steering``; the runner carries them out and
hands ended attempts to ``calibration``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker import clock
from broker.core.errors import BudgetExceeded
from broker.core.job_status import JobStatus, is_terminal
from broker.db.engine import open_session
from broker.db.models import Attempt, Job
from broker.faults import fault_point
from broker.services import lifecycle
from broker.services.calibration import calibrate
from broker.services.lifecycle import LAUNCHING, RUNNING, ToTerminate
from broker.services.metrics import PROVIDER_ERRORS
from broker.services.plans import ChosenPlan, job_plan
from broker.services.quoting import Planning
from broker.services.reconcile import ReconcileReport, reconcile
from broker.services.steering import market_now, refused_zones, steer
from providers.base import (
    TAG_ATTEMPT,
    TAG_JOB,
    TAG_TEAM,
    CapacityError,
    InstanceNotFound,
    InstanceRef,
    LaunchRequest,
    Provider,
    ProviderError,
    QuotaError,
    TransientError,
)

log = logging.getLogger(__name__)
MOVE_REASONS = {  # steer's market switches, as the migration reason says them
    "spot": "spot again: moving back from on-demand",
    "on_demand": "deadline close: moving to on-demand",
}

# Jobs a tick launches when they have no live attempt (running too: a crash can leave a job
# marked running after its attempt ended; launching again resumes it from its checkpoint).
WAITING = (
    JobStatus.QUEUED.value,
    JobStatus.PREEMPTED.value,
    JobStatus.PROVISIONING.value,
    JobStatus.RUNNING.value,
)


def agent_token(secret: str, attempt_id: str) -> str:
    """The per-attempt token an instance reports with: derived, so a retried launch can
    hand the same one to the instance its idempotent launch returns."""
    digest = hmac.new(secret.encode(), attempt_id.encode(), hashlib.sha256).hexdigest()
    return f"att_{digest[:40]}"


@dataclass
class TickReport:
    """What one tick found to do."""

    observe: list[str] = field(default_factory=list)
    launch: list[str] = field(default_factory=list)


class Runner:
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
    ) -> None:
        self.engine = engine
        self.providers = dict(providers)
        self.planning = planning
        self.agent_secret = agent_secret
        self.api_url = api_url
        self.tick_seconds = tick_seconds
        self.checkpoint_bucket = checkpoint_bucket

    def _session(self) -> Session:
        return open_session(self.engine)

    # -- launching ------------------------------------------------------------------------

    def launch(self, job_id: str, market: str | None = None) -> str | None:
        """Launch the job's next plan (or finish a launch under way); returns the attempt id."""
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
            if job.checkpointed_work >= job.total_work:
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
            excluded = refused_zones(session, now, job_id)
            market = market or market_now(self.planning, session, job, now, self.tick_hours)
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
            tried: set[tuple[str, str, str]] = set()
            for choice in self._first_plan(session, job) + replan.choices[:3]:
                offer = (choice.zone, choice.instance_type, choice.market)
                if offer in tried:
                    continue
                tried.add(offer)
                try:
                    begun = lifecycle.begin_attempt(
                        session,
                        job_id,
                        choice,
                        now,
                        token_for=lambda attempt_id: agent_token(self.agent_secret, attempt_id),
                        reserve_up_to=choice.worst_case_cost_micros,
                    )
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

    def _first_plan(self, session: Session, job: Job) -> list[ChosenPlan]:
        """The plan admission chose and showed, for a job's first launch."""
        plan = job_plan(job)
        if plan is None or session.exec(select(Attempt.id).where(Attempt.job_id == job.id)).first():
            return []
        return [plan]

    @property
    def tick_hours(self) -> float:
        """Broker-clock hours between two ticks."""
        return self.tick_seconds * clock.scale() / 3600

    def _launch_attempt(self, session: Session, job: Job, attempt: Attempt) -> str | None:
        provider = self.providers[attempt.provider]
        checkpoint = lifecycle.latest_checkpoint(session, job.id)
        resume = {
            "api_url": self.api_url,
            "attempt_id": attempt.id,
            "token": agent_token(self.agent_secret, attempt.id),
            "job_id": job.id,
            "workload": job.spec["workload"],
            "gpu": attempt.gpu,
            "gpu_count": attempt.gpu_count,
            "start_work": attempt.work_at_start,
            "total_work": job.total_work,
            "checkpoint_interval_seconds": job.spec["checkpoint"]["interval_minutes"] * 60,
            "checkpoint_bucket": self.checkpoint_bucket,
            "checkpoint_prefix": f"jobs/{job.id}",
            "latest_checkpoint": checkpoint.object_key if checkpoint else None,
        }
        request = LaunchRequest(
            token=attempt.id,
            provider=attempt.provider,
            region=attempt.region,
            zone=attempt.zone,
            instance_type=attempt.instance_type,
            market="spot" if attempt.market == "spot" else "on_demand",
            gpu=attempt.gpu,
            gpu_count=attempt.gpu_count,
            tags={TAG_JOB: job.id, TAG_ATTEMPT: attempt.id, TAG_TEAM: job.team_id},
            user_data=resume,
        )
        try:
            ref = provider.launch(request)
        except CapacityError as error:
            PROVIDER_ERRORS.labels(attempt.provider, "capacity").inc()
            lifecycle.launch_failed(session, attempt.id, "capacity", clock.now())
            log.info("no capacity: %s", error, extra={"job_id": job.id, "zone": attempt.zone})
            return None
        except QuotaError as error:
            PROVIDER_ERRORS.labels(attempt.provider, "quota").inc()
            lifecycle.launch_failed(session, attempt.id, "quota", clock.now())
            log.warning("quota: %s", error, extra={"job_id": job.id})
            return None
        except TransientError:
            PROVIDER_ERRORS.labels(attempt.provider, "transient").inc()
            raise  # the adapter already retried; let the task retry the same attempt later
        except ProviderError as error:
            PROVIDER_ERRORS.labels(attempt.provider, "other").inc()
            lifecycle.launch_failed(session, attempt.id, "failed", clock.now())
            log.warning("launch failed: %s", error, extra={"job_id": job.id})
            return None
        fault_point("after_launch")
        self._terminate(
            lifecycle.launch_succeeded(session, attempt.id, ref.instance_id, clock.now())
        )
        log.info(
            "attempt running",
            extra={
                "job_id": job.id,
                "attempt_id": attempt.id,
                "zone": attempt.zone,
                "market": attempt.market,
            },
        )
        return attempt.id

    # -- watching -------------------------------------------------------------------------

    def due(self) -> TickReport:
        """The attempts to observe and the jobs to launch at this tick."""
        report = TickReport()
        with self._session() as session:
            report.observe = list(
                session.exec(
                    select(Attempt.id).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
                ).all()
            )
            busy = set(
                session.exec(
                    select(Attempt.job_id).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
                ).all()
            )
            waiting = session.exec(select(Job.id).where(col(Job.status).in_(WAITING))).all()
            report.launch = [job_id for job_id in waiting if job_id not in busy]
        return report

    def observe(self, attempt_id: str) -> None:
        """Poll one attempt's instance: book spend, notice preemption, finish or steer."""
        with self._session() as session:
            attempt = session.get(Attempt, attempt_id)
            if attempt is None or attempt.status not in (LAUNCHING, RUNNING):
                return
            job = session.get(Job, attempt.job_id)
            assert job is not None
            if attempt.status == LAUNCHING:
                self._launch_attempt(session, job, attempt)
                return
            now = clock.now()
            ref = InstanceRef(
                attempt.provider, attempt.region, attempt.zone, attempt.instance_id or ""
            )
            try:
                state = self.providers[attempt.provider].describe(ref)
            except InstanceNotFound:
                PROVIDER_ERRORS.labels(attempt.provider, "not_found").inc()
                state = None
            except TransientError as error:
                PROVIDER_ERRORS.labels(attempt.provider, "transient").inc()
                log.info("describe failed, next tick: %s", error, extra={"attempt_id": attempt_id})
                return
            if state is None or state.status in ("terminated", "preempted"):
                lifecycle.preempted(session, attempt_id, now)
                calibrate(self.planning, session, attempt_id)
                log.info(
                    "instance gone: %s",
                    state.reason if state else "not found",
                    extra={"job_id": job.id, "attempt_id": attempt_id},
                )
                return
            lookahead = 2 * self.tick_seconds * clock.scale()
            stopped = lifecycle.accrue(session, attempt_id, now, lookahead)
            if stopped:
                self._terminate(stopped)
                return
            session.refresh(job)
            if job.work_done >= job.total_work:
                fault_point("before_settle")
                self._terminate(
                    lifecycle.stop(session, job.id, JobStatus.SUCCEEDED, "work reached", now)
                )
                calibrate(self.planning, session, attempt_id)
            elif now >= job.deadline:
                self._terminate(
                    lifecycle.stop(
                        session, job.id, JobStatus.DEADLINE_MISSED, "deadline passed", now
                    )
                )
            else:
                self._steer(session, job, attempt, now)

    def _steer(self, session: Session, job: Job, attempt: Attempt, now: datetime) -> None:
        """Carry out what ``steering.steer`` decides for a running attempt: keep it, or end it
        and launch the job on the other market."""
        decision = steer(self.planning, session, job, attempt, now, self.tick_hours)
        if decision == "continue":
            return
        self._terminate(lifecycle.migrate(session, attempt.id, MOVE_REASONS[decision], now))
        # Launch on the speeds steer checked the new plan with, then learn from the attempt:
        # a short attempt's noisy speed must not turn that plan into a stop.
        self.launch(job.id, market=decision)
        calibrate(self.planning, session, attempt.id)

    # -- cleaning up ----------------------------------------------------------------------

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
        return reconcile(self.engine, self.providers, self._regions)

    def _regions(self, provider: str) -> list[str]:
        adapter = self.providers[provider]
        regions = getattr(adapter, "regions", None)
        if regions:
            return list(regions)
        return sorted({zone.rsplit("-", 1)[0] for zone in getattr(adapter, "zones", [])})
