"""Watching running attempts: the lease sweep and each tick's observations, batched.

The half of ``Runner`` that follows what runs: it books spend (a batch's common case in one
transaction through ``accrual.accrue_many``, the rest through ``lifecycle.accrue``), notices
preempted instances and silent agents, settles jobs whose work a checkpoint holds or whose
deadline passed, and asks ``steering`` whether to switch market. ``Runner`` (launching,
cleanup) mixes it in and provides the launch and terminate it calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from broker import clock
from broker.core.job_status import JobStatus
from broker.db.engine import begin_write, one_of
from broker.db.models import Attempt, Job
from broker.faults import fault_point
from broker.services import lifecycle
from broker.services.accrual import accrue_many
from broker.services.agent_channel import report_wall_seconds
from broker.services.calibration import calibrate
from broker.services.lifecycle import LAUNCHING, RUNNING, ToTerminate
from broker.services.metrics import PROVIDER_ERRORS
from broker.services.quoting import Planning
from broker.services.spend_control import SpendControls, leases_due, lookahead_seconds
from broker.services.steering import FleetView, fleet_view, move_back_excluded, steer
from providers.base import InstanceNotFound, InstanceRef, InstanceState, Provider, TransientError

log = logging.getLogger(__name__)

MOVE_REASONS = {  # steer's market switches, as the migration reason says them
    "spot": "spot again: moving back from on-demand",
    "on_demand": "deadline close: moving to on-demand",
}
SWEEP_BATCH = 500  # attempts booked per transaction by the lease sweep
# where a running attempt's instances are (``lifecycle.instances_of``)
_PLACE = (
    Attempt.id,
    Attempt.provider,
    Attempt.region,
    Attempt.zone,
    Attempt.instance_id,
    Attempt.nodes,
)


def claim(session: Session, attempt_ids: Sequence[str], tick: datetime) -> list[str]:
    """The live attempts among ``attempt_ids`` no batch has observed for ``tick`` (or a later
    tick), now claimed for it, in the order given: one statement, committed.

    On PostgreSQL an attempt whose row another transaction holds (a booking, a report) is
    skipped (SKIP LOCKED), left to the next tick: the claim then waits for no lock, so it
    cannot deadlock with a batch booking those attempts in another order (the 2,000-job
    soak's one ``deadlock detected`` between ``accrue_many`` and a claim)."""
    if not attempt_ids:
        return []
    begin_write(session)
    free = (
        select(Attempt.id)
        .where(
            one_of(session, Attempt.id, attempt_ids),
            col(Attempt.status).in_((LAUNCHING, RUNNING)),
            or_(col(Attempt.observed_tick).is_(None), col(Attempt.observed_tick) < tick),
        )
        .with_for_update(skip_locked=True)  # SQLite: no row locks, rendered as nothing
    )
    statement = (
        update(Attempt)
        .where(col(Attempt.id).in_(free.scalar_subquery()))
        .values(observed_tick=tick)
        .returning(col(Attempt.id))
    )
    claimed = set(session.execute(statement).scalars())
    session.commit()
    return [attempt_id for attempt_id in attempt_ids if attempt_id in claimed]


class Watching:
    """Observation and the lease sweep; mixed into ``Runner``, which sets these attributes
    and provides the methods below that raise."""

    providers: dict[str, Provider]
    planning: Planning
    controls: SpendControls
    tick_seconds: float
    agent_silence_seconds: float
    agent_boot_grace_seconds: float
    agent_report_seconds: float

    def _session(self) -> Session:
        raise NotImplementedError

    @property
    def lease_seconds(self) -> float:
        raise NotImplementedError

    @property
    def tick_hours(self) -> float:
        raise NotImplementedError

    def launch(
        self, job_id: str, market: str | None = None, exclude_zones: Iterable[str] = ()
    ) -> str | None:
        raise NotImplementedError

    def _launch_attempt(self, session: Session, job: Job, attempt: Attempt) -> str | None:
        raise NotImplementedError

    def _terminate(self, instances: list[ToTerminate]) -> None:
        raise NotImplementedError

    def sweep_leases(self) -> int:
        """Renew, or stop, every running attempt whose spend lease ends within the renewal
        window, nearest first (``spend_control``); returns how many were due. The common
        case is booked in batches (``accrual.accrue_many``), the rest one by one."""
        lookahead = lookahead_seconds(self.tick_seconds * clock.scale())
        window = self.controls.renew_ticks * self.tick_seconds * clock.nominal_scale()
        with self._session() as session:
            due = leases_due(session, clock.now(), window)
            for start in range(0, len(due), SWEEP_BATCH):
                now = clock.now()
                chunk = [(attempt_id, now) for attempt_id in due[start : start + SWEEP_BATCH]]
                batch = accrue_many(session, chunk, lookahead, lease_seconds=self.lease_seconds)
                for attempt_id in batch.one_by_one:
                    stopped = lifecycle.accrue(
                        session,
                        attempt_id,
                        clock.now(),
                        lookahead,
                        lease_seconds=self.lease_seconds,
                    )
                    self._terminate(stopped)
        return len(due)

    def observe_many(self, attempt_ids: Sequence[str], tick: datetime | None = None) -> int:
        """Observe a batch of attempts: their instances are described together, one
        ``describe_many`` per provider and region (a region whose describe fails leaves its
        attempts to the next tick), then decided at the time the cloud answered. The common
        case (instance up, agent heard, spend within the job's reservation) is booked for the
        whole batch in one transaction (``accrual.accrue_many``); every other attempt goes
        through ``observe`` on its own. Returns how many cloud calls' worth of regions it
        asked.

        ``tick``: the broker time of the beat tick that sent the batch. The batch then
        observes only the attempts it claims for that tick (``claim``), so a worker handed
        the same attempts for the same tick again (a redelivered or duplicated task, a
        second worker) observes none of them twice."""
        groups: dict[tuple[str, str], list[InstanceRef]] = {}
        with self._session() as session:
            if tick is not None:
                attempt_ids = claim(session, attempt_ids, tick)
            running = session.execute(  # columns, not objects: the batch reads them again
                select(*_PLACE).where(
                    one_of(session, Attempt.id, attempt_ids), col(Attempt.status) == RUNNING
                )
            ).all()
            refs = {
                attempt_id: [
                    InstanceRef(item.provider, item.region, item.zone, item.instance_id)
                    for item in items
                ]
                for attempt_id, items in lifecycle.instances_of(session, running).items()
            }
        for row in running:
            groups.setdefault((row.provider, row.region), []).extend(refs[row.id])
        known: dict[InstanceRef, InstanceState | None] = {}
        failed: set[tuple[str, str]] = set()
        for (provider, region), wanted in groups.items():
            try:
                known.update(self.providers[provider].describe_many(wanted))
            except TransientError as error:
                PROVIDER_ERRORS.labels(provider, "transient").inc()
                log.info("describe of %s %s failed, next tick: %s", provider, region, error)
                failed.add((provider, region))
        now = clock.now()  # the batch's decisions stand at the cloud's answer
        # a region whose describe failed leaves its running attempts to the next tick
        skipped = {row.id for row in running if (row.provider, row.region) in failed}
        observed = [attempt_id for attempt_id in attempt_ids if attempt_id not in skipped]
        alone = self._decide_batch(observed, refs, known, now)
        for attempt_id in alone:
            self.observe(attempt_id, known=known, skip_regions=failed, observed_at=now)
        return len(groups)

    def _decide_batch(
        self,
        attempt_ids: Sequence[str],
        refs: Mapping[str, list[InstanceRef]],
        known: Mapping[InstanceRef, InstanceState | None],
        now: datetime,
    ) -> list[str]:
        """Book and decide the batch's common case together; returns the attempts that need
        ``observe`` on their own (launching, instance gone, agent silent, money to top up or
        a lapsed lease, a describe that did not cover them). ``refs``: each running
        attempt's instances, as the batch described them."""

        def ready(attempt: Attempt) -> bool:  # judged on the row read under the batch's lock
            up = self._up(refs.get(attempt.id, []), attempt.nodes, known)
            return up and self._silent(attempt, now) is None

        lookahead = lookahead_seconds(self.tick_seconds * clock.scale())
        with self._session() as session:
            booked = accrue_many(
                session,
                [(attempt_id, now) for attempt_id in attempt_ids],
                lookahead,
                lease_seconds=self.lease_seconds,
                ready=ready,
            )
            if not booked.booked:
                return booked.one_by_one
            jobs = booked.jobs  # read under the lock, with what the agents had reported
            # one read of the fleet's spot history for every auto job's decision
            auto = any(job.market == "auto" for job in jobs.values())
            view = fleet_view(session, now) if auto else None
            for attempt_id in booked.booked:
                attempt = booked.attempts[attempt_id]
                self._decide(session, jobs[attempt.job_id], attempt, now, view)
        return booked.one_by_one

    @staticmethod
    def _up(
        refs: Sequence[InstanceRef],
        nodes: int,
        known: Mapping[InstanceRef, InstanceState | None],
    ) -> bool:
        """Whether a batch describe saw every instance of a running attempt, all up."""
        if len(refs) < nodes or any(ref not in known for ref in refs):
            return False
        return all(
            (state := known[ref]) is not None and state.status not in ("terminated", "preempted")
            for ref in refs
        )

    def observe(
        self,
        attempt_id: str,
        *,
        known: Mapping[InstanceRef, InstanceState | None] | None = None,
        skip_regions: set[tuple[str, str]] | None = None,
        observed_at: datetime | None = None,
    ) -> None:
        """Poll one attempt's instance: book spend, notice preemption, finish or steer.
        ``known``: states a batch describe already returned (``observe_many``)."""
        with self._session() as session:
            attempt = session.get(Attempt, attempt_id)
            if attempt is None or attempt.status not in (LAUNCHING, RUNNING):
                return
            job = session.get(Job, attempt.job_id)
            assert job is not None
            if attempt.status == LAUNCHING:
                self._launch_attempt(session, job, attempt)
                return
            if skip_regions and (attempt.provider, attempt.region) in skip_regions:
                return
            try:
                state = self._describe(session, attempt, known)
            except TransientError as error:
                PROVIDER_ERRORS.labels(attempt.provider, "transient").inc()
                log.info("describe failed, next tick: %s", error, extra={"attempt_id": attempt_id})
                return
            # Every decision below stands at the observation's time: when the cloud answered
            # (on a loaded scaled clock a describe can take broker-minutes), not when the
            # tick asked for it nor when the task began.
            now = clock.now() if observed_at is None or known is None else observed_at
            session.refresh(attempt)  # what the agent reported up to the observation
            if attempt.status != RUNNING:
                return  # it ended meanwhile (the agent's exit report, a cancel)
            if state is None or state.status in ("terminated", "preempted"):
                ended = lifecycle.preempted(session, attempt_id, now)
                if attempt.nodes > 1:
                    self._terminate(ended)  # a gang stops whole when one node is gone
                calibrate(self.planning, session, attempt_id)
                log.info(
                    "instance gone: %s",
                    state.reason if state else "not found",
                    extra={"job_id": job.id, "attempt_id": attempt_id},
                )
                return
            if self._lost(session, attempt, now):
                return
            lookahead = lookahead_seconds(self.tick_seconds * clock.scale())
            stopped = lifecycle.accrue(
                session, attempt_id, now, lookahead, lease_seconds=self.lease_seconds
            )
            if stopped:
                self._terminate(stopped)
                return
            session.refresh(job)
            self._decide(session, job, attempt, now)

    def _decide(
        self,
        session: Session,
        job: Job,
        attempt: Attempt,
        now: datetime,
        view: FleetView | None = None,
    ) -> None:
        """After a running attempt's spend is booked: settle the job whose work a checkpoint
        holds, stop it at its deadline, else steer it."""
        if lifecycle.work_complete(job):  # a checkpoint holds it all, not a report's word
            fault_point("before_settle")
            self._terminate(
                lifecycle.stop(
                    session, job.id, JobStatus.SUCCEEDED, "work reached (checkpointed)", now
                )
            )
            calibrate(self.planning, session, attempt.id)
        elif now >= job.deadline:
            self._terminate(
                lifecycle.stop(session, job.id, JobStatus.DEADLINE_MISSED, "deadline passed", now)
            )
        else:
            self._steer(session, job, attempt, now, view)

    def _describe(
        self,
        session: Session,
        attempt: Attempt,
        known: Mapping[InstanceRef, InstanceState | None] | None = None,
    ) -> InstanceState | None:
        """The state of a running attempt's instance: None when the cloud does not know it.
        A gang's nodes are described in one call; the first node that is gone (not found,
        terminated, preempted) stands for the gang, else node 0's state does. States a
        batch describe returned (``known``) are used as they are."""
        provider = self.providers[attempt.provider]
        refs = [
            InstanceRef(item.provider, item.region, item.zone, item.instance_id)
            for item in lifecycle.attempt_instances(session, attempt)
        ] or [InstanceRef(attempt.provider, attempt.region, attempt.zone, "")]
        if known is not None and all(ref in known for ref in refs):
            states: Mapping[InstanceRef, InstanceState | None] = known
        elif attempt.nodes <= 1:
            try:
                return provider.describe(refs[0])
            except InstanceNotFound:
                PROVIDER_ERRORS.labels(attempt.provider, "not_found").inc()
                return None
        else:
            states = provider.describe_many(refs)
        if len(refs) < attempt.nodes:
            return None  # a running gang lacks a node's record: not a whole gang
        for ref in refs:
            state = states.get(ref)
            if state is None:
                PROVIDER_ERRORS.labels(attempt.provider, "not_found").inc()
                return None
            if state.status in ("terminated", "preempted"):
                return state
        return states[refs[0]]

    def _silent(self, attempt: Attempt, now: datetime) -> float | None:
        """Seconds a running attempt's agent has been silent past what is allowed (its
        instance runs, its program does not report), else None."""
        since = attempt.last_heard_at or attempt.started_at
        allowed = self.agent_silence_seconds
        if attempt.last_heard_at is None:
            allowed += self.agent_boot_grace_seconds
        # On a fast clock an agent reports at most once a wall second (report_wall_seconds):
        # allow as many missed reports as at the configured pace, not fewer.
        scale = clock.scale()
        pace = report_wall_seconds(self.agent_report_seconds, scale) * scale
        allowed *= max(1.0, pace / self.agent_report_seconds)
        if since is None or (now - since).total_seconds() <= allowed:
            return None
        return (now - since).total_seconds()

    def _lost(self, session: Session, attempt: Attempt, now: datetime) -> bool:
        """End a running attempt whose agent has been silent too long: the job relaunches
        from its latest checkpoint."""
        silent = self._silent(attempt, now)
        if silent is None:
            return False
        since = attempt.last_heard_at or attempt.started_at
        heard = "last heard" if attempt.last_heard_at else "never heard since its launch"
        reason = f"agent silent for {silent:.0f} s ({heard}): instance lost"
        ended = lifecycle.lost(session, attempt.id, now, reason, silent_since=since)
        if not ended:
            return False  # the agent spoke meanwhile, or the attempt ended already
        self._terminate(ended)
        log.warning(
            "agent silent, attempt lost",
            extra={"job_id": attempt.job_id, "attempt_id": attempt.id, "silent_s": silent},
        )
        return True

    def _steer(
        self,
        session: Session,
        job: Job,
        attempt: Attempt,
        now: datetime,
        view: FleetView | None = None,
    ) -> None:
        """Carry out what ``steering.steer`` decides for a running attempt: keep it, or end it
        and launch the job on the other market."""
        self.planning.sync(session)
        if view is None and attempt.market == "on_demand" and job.market == "auto":
            view = fleet_view(session, now)  # read once: steer weighs it, a move's launch too
        decision = steer(self.planning, session, job, attempt, now, self.tick_hours, view)
        if decision == "continue":
            return
        if decision == "spot":
            # Make before break, outside the zones the policy weighed as without spot: the
            # on-demand attempt ends only once a spot instance runs; a refusal costs nothing.
            excluded = move_back_excluded(self.planning, view) if view is not None else set()
            if self.launch(job.id, market="spot", exclude_zones=excluded, replacing=attempt.id):
                log.info(MOVE_REASONS["spot"], extra={"job_id": job.id, "attempt_id": attempt.id})
                session.expire(attempt)  # another session ended it
                calibrate(self.planning, session, attempt.id)
            return
        self._terminate(lifecycle.migrate(session, attempt.id, MOVE_REASONS[decision], now))
        # Launch on the speeds steer checked the new plan with, then learn from the attempt:
        # a short attempt's noisy speed must not turn that plan into a stop.
        self.launch(job.id, market=decision)
        calibrate(self.planning, session, attempt.id)

    # -- cleaning up ----------------------------------------------------------------------
