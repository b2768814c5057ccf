"""What a running attempt costs and may cost: per-second billing with the provider's minimum,
spend leases, booking to the ledger, and the team's budget alert.

A running attempt holds a *lease*: spend granted up to ``Attempt.lease_until`` (broker
clock), never more than the money its job still holds reserved (topped up from its team's
free budget, within ``max_cost``). Booking stops at the lease; time billed past it is booked
as an overrun (``ledger.OVERRUN``) with a warning. So the spend the broker grants never
passes a job's ``max_cost`` nor its team's limit, whether or not the control loop keeps up.

These helpers run inside a ``lifecycle`` transaction that holds the job's row; the state
changes that call them (``lifecycle.accrue``, ``launch_succeeded`` and the functions that
end an attempt) decide when an attempt is billed and its lease renewed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from prometheus_client import Counter
from sqlmodel import Session

from broker.core import accrual
from broker.core.money import format_usd
from broker.db.models import Attempt, Job, Team
from broker.services.ledger import (
    OVERRUN,
    book_spend,
    job_reserved,
    job_spent,
    lock_team,
    reserve,
    team_budget,
)

log = logging.getLogger(__name__)

MIN_BILLED_SECONDS = {"aws": 60.0, "gcp": 60.0}


def billed_seconds(attempt: Attempt, until: datetime) -> float:
    """Seconds billed for a started attempt up to ``until`` (per second, provider minimum)."""
    return accrual.billed_seconds(attempt.started_at, until, minimum_seconds(attempt))


def minimum_seconds(attempt: Attempt) -> float:
    """The provider's minimum billed time for an attempt's instances."""
    return MIN_BILLED_SECONDS.get(attempt.provider, 60.0)


def billed_until(attempt: Attempt) -> datetime | None:
    """The broker time an attempt's booking reaches, when past its minimum billed time
    (before that, the minimum says nothing of when it ran to); else None."""
    if attempt.started_at is None or attempt.billed_seconds <= minimum_seconds(attempt):
        return None
    return attempt.started_at + timedelta(seconds=attempt.billed_seconds)


OVERRUN_MICROS = Counter(
    "broker_overrun_micros", "Spend booked past attempts' leases (micro-USD)", ["provider"]
)


def bill(session: Session, job: Job, attempt: Attempt, now: datetime) -> int:
    """Book what a running attempt has cost since its last booking; returns what was booked
    within its lease. Time past the lease is booked as an overrun and logged."""
    booked = accrual.booking(
        attempt.price_micros_per_hour,
        attempt.started_at,
        minimum_seconds(attempt),
        attempt.billed_seconds,
        attempt.cost_micros,
        attempt.lease_until,
        now,
    )
    spend, overrun = booked.spend, booked.overrun
    attempt.billed_seconds = booked.billed_seconds
    if spend or overrun:
        attempt.cost_micros = booked.cost_micros
        book_spend(session, job, attempt, spend, now)
    if overrun:
        book_spend(session, job, attempt, overrun, now, kind=OVERRUN)
        OVERRUN_MICROS.labels(attempt.provider).inc(overrun)
        log.warning(
            "attempt ran %s USD past its lease (lease until %s)",
            format_usd(overrun),
            attempt.lease_until.isoformat() if attempt.lease_until else "-",
            extra={"job_id": job.id, "attempt_id": attempt.id, "team_id": job.team_id},
        )
    session.add(attempt)
    return spend


def renew_lease(
    session: Session, job: Job, attempt: Attempt, now: datetime, horizon_seconds: float
) -> float:
    """Grant a running attempt spend up to ``horizon_seconds`` past ``now``, within what its
    job may still spend; returns the seconds granted past ``now`` (0: no money left).

    The job's reservation is topped up from its team's free budget when it holds less than
    the horizon costs (never past ``max_cost``), so a lease is always money set aside. A
    top-up takes a second horizon's worth ahead, so the renewals after it find the money
    held and are booked in the control loop's batch (``accrual.accrue_many``), without
    this team lock: topped up to the need alone, a job whose lease outlasts its reservation
    came back here at every observation.
    """
    price = attempt.price_micros_per_hour
    assert attempt.started_at is not None
    need = accrual.lease_need(
        price,
        attempt.started_at,
        minimum_seconds(attempt),
        attempt.cost_micros,
        now,
        horizon_seconds,
    )
    held = job_reserved(session, job.id)
    left = job.max_cost_micros - job_spent(session, job.id)
    if need > held and left > held:
        team = lock_team(session, job.team_id)
        available = max(team_budget(session, team, now).available, 0)
        top_up = min(2 * need - held, left - held, available)
        if top_up > 0:
            reserve(session, team, job, top_up, now)
            held += top_up
    attempt.lease_until = accrual.lease_end(
        price,
        attempt.started_at,
        attempt.cost_micros,
        min(need, held, left),
        attempt.lease_until,
        now,
        horizon_seconds,
    )
    session.add(attempt)
    return max((attempt.lease_until - now).total_seconds(), 0.0)


def warn_on_alert(session: Session, job: Job, booked: int, now: datetime) -> None:
    """Log a warning when this booking takes the team's spend past its alert threshold."""
    warn_if_alert_crossed(session, job.team_id, booked, now, job_id=job.id)


def warn_if_alert_crossed(
    session: Session, team_id: str, booked: int, now: datetime, *, job_id: str | None = None
) -> None:
    """Log a warning when ``booked`` (just booked for the team, one job's or a batch's)
    took the team's spend past its alert threshold."""
    team = session.get(Team, team_id)
    if team is None or not booked:
        return
    figures = team_budget(session, team, now)
    threshold = figures.alert_at * figures.limit
    if figures.spent - booked < threshold <= figures.spent:
        extra = {"team_id": team.id} | ({"job_id": job_id} if job_id else {})
        log.warning(
            "team %s passed its budget alert: %s of %s USD spent",
            team.name,
            format_usd(figures.spent),
            format_usd(figures.limit),
            extra=extra,
        )
