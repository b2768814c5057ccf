"""Admission: validate a submitted job, reserve its budget and queue it, in one transaction."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import make_transient_to_detached
from sqlmodel import Session, select

from broker.core.errors import BudgetExceeded, Conflict, InvalidInput
from broker.core.job_status import JobStatus
from broker.core.money import to_micros
from broker.core.planner import Plan
from broker.db.engine import begin_write
from broker.db.ids import new_id
from broker.db.models import Job
from broker.services.job_spec import JobSpec
from broker.services.ledger import lock_and_reserve
from broker.services.plans import ChosenPlan
from broker.services.quoting import get_planning, quote_job
from broker.services.reservations import job_reservation, on_demand_only, tick_hours
from broker.services.workdirs import check_run_workdir

log = logging.getLogger(__name__)

MAX_HORIZON = timedelta(days=365)


def request_hash(spec: JobSpec) -> str:
    """A stable digest of a spec, to tell a retried submission from a different one."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_deadline(spec: JobSpec, now: datetime) -> None:
    """The (resolved) deadline must lie in the future and within a year."""
    deadline = spec.deadline_at
    if deadline <= now:
        raise InvalidInput(f"deadline {deadline.isoformat()} is in the past", "deadline")
    if deadline > now + MAX_HORIZON:
        raise InvalidInput("deadline is more than a year away", "deadline")


def reservation(
    session: Session, job: Job, plan: Plan, on_demand: Plan | None, now: datetime
) -> int:
    """What admission holds for a job: a proven bound of what its policy may spend on
    ``plan`` (``broker.core.reservation``), never more than max_cost; ``on_demand``: the
    quote's cheapest on-demand plan, whose cost the bound is a multiple of."""
    chosen = ChosenPlan.from_plan(plan)
    planning = get_planning()
    return job_reservation(planning, session, job, chosen, now, tick_hours(), on_demand=on_demand)


def _existing(session: Session, team_id: str, key: str, digest: str) -> Job | None:
    job = session.exec(
        select(Job).where(Job.team_id == team_id, Job.idempotency_key == key)
    ).first()
    if job is not None and job.request_hash != digest:
        raise Conflict(f"Idempotency-Key {key!r} was used with another request body")
    return job


_INSERT_JOB = insert(Job.__table__)  # type: ignore[attr-defined]
_JOB_COLUMNS = tuple(column.key for column in Job.__table__.columns)  # type: ignore[attr-defined]


def _insert(session: Session, job: Job) -> None:
    """INSERT a new job row with a Core statement: half the CPU of an ORM flush of it (the
    object joins the session once committed, ``_attach``)."""
    session.execute(_INSERT_JOB, {key: getattr(job, key) for key in _JOB_COLUMNS})


def _attach(session: Session, job: Job) -> Job:
    """The committed new job, in the session as the persistent row it now is."""
    make_transient_to_detached(job)
    session.add(job)
    return job


@dataclass(frozen=True)
class Admitted:
    """A submission's outcome: the job, whether it was created (False: an earlier submission
    with the same Idempotency-Key and body) and what was reserved for it (0 when not created)."""

    job: Job
    created: bool
    reserved: int = 0


def submit(
    session: Session, team_id: str, spec: JobSpec, now: datetime, idempotency_key: str | None = None
) -> tuple[Job, bool]:
    """``admit``: the job and whether it was created."""
    admitted = admit(session, team_id, spec, now, idempotency_key)
    return admitted.job, admitted.created


def admit(
    session: Session, team_id: str, spec: JobSpec, now: datetime, idempotency_key: str | None = None
) -> Admitted:
    """Admit a job on its best plan: reserve what its policy may spend (``reservation``)
    against the locked team budget and queue it.

    The quote and the reservation are worked out, and the job row inserted, before the team
    row is locked; the lock covers only the budget check and the reserve entry
    (``ledger.lock_and_reserve``) and the commit. A concurrent submission with the same
    Idempotency-Key waits on the job's unique key and then finds this one.
    Raises BudgetExceeded, Conflict or InvalidInput.
    """
    digest = request_hash(spec)  # as submitted: a relative deadline hashes as its span text
    spec = spec.resolved(now)
    check_deadline(spec, now)
    check_run_workdir(spec, team_id)
    plans = quote_job(spec, now, session, top_n=1)  # the best plan; cheapest_on_demand too
    best = plans.plans[0]
    on_demand = plans.cheapest_on_demand
    if idempotency_key and (job := _existing(session, team_id, idempotency_key, digest)):
        return Admitted(job, False)
    planning = get_planning()
    chosen = ChosenPlan.from_plan(best)
    job = Job(
        id=new_id("job"),
        team_id=team_id,
        name=spec.name,
        status=JobStatus.QUEUED,
        spec=spec.model_dump(mode="json"),
        market=spec.market,
        total_work=spec.total_work,
        deadline=spec.deadline_at,
        start_by=chosen.start_by(spec.deadline_at),
        max_cost_micros=to_micros(spec.max_cost),
        on_demand_cost_micros=on_demand.expected_cost_micros if on_demand else None,
        on_demand_only_micros=on_demand_only(spec, on_demand, planning.startup_hours),
        plan=chosen.to_json(),
        priority=spec.priority,
        idempotency_key=idempotency_key,
        request_hash=digest,
        created_at=now,
        updated_at=now,
    )
    amount = reservation(session, job, best, on_demand, now)
    begin_write(session)  # SQLite: the write transaction starts here, before the insert
    try:
        _insert(session, job)
        lock_and_reserve(session, team_id, job.id, amount, now)
        session.commit()
    except BudgetExceeded:
        session.rollback()  # let go of the team row now, not when the session closes
        raise
    except IntegrityError:
        # A concurrent submission with the same Idempotency-Key won the race.
        session.rollback()
        if idempotency_key and (existing := _existing(session, team_id, idempotency_key, digest)):
            return Admitted(existing, False)
        raise
    log.info("job queued", extra={"job_id": job.id, "team_id": team_id})
    return Admitted(_attach(session, job), True, amount)
