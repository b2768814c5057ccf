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
import math
from datetime import datetime, timedelta

from prometheus_client import Counter
from sqlmodel import Session

from broker.core.money import cost_micros, format_usd
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
    if attempt.started_at is None:
        return 0.0
    elapsed = max((until - attempt.started_at).total_seconds(), 0.0)
    return max(elapsed, MIN_BILLED_SECONDS.get(attempt.provider, 60.0))


OVERRUN_MICROS = Counter(
    "broker_overrun_micros", "Spend booked past attempts' leases (micro-USD)", ["provider"]
)


def bill(session: Session, job: Job, attempt: Attempt, now: datetime) -> int:
    """Book what a running attempt has cost since its last booking; returns what was booked
    within its lease. Time past the lease is booked as an overrun and logged."""
    # Billing never runs backwards: a worker that read the clock before another booked a
    # later time must not leave billed_seconds short of what cost_micros already holds.
    seconds = max(billed_seconds(attempt, now), attempt.billed_seconds)
    total = cost_micros(attempt.price_micros_per_hour, seconds)
    granted = total
    if attempt.lease_until is not None:
        granted = cost_micros(
            attempt.price_micros_per_hour, billed_seconds(attempt, attempt.lease_until)
        )
    spend = max(min(total, granted) - attempt.cost_micros, 0)
    overrun = max(total - attempt.cost_micros - spend, 0)
    attempt.billed_seconds = seconds
    if spend or overrun:
        attempt.cost_micros = total
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
    the horizon costs (never past ``max_cost``), so a lease is always money set aside.
    """
    price = attempt.price_micros_per_hour
    want = cost_micros(price, billed_seconds(attempt, now + timedelta(seconds=horizon_seconds)))
    need = want - attempt.cost_micros  # what the horizon costs beyond what is booked
    held = job_reserved(session, job.id)
    left = job.max_cost_micros - job_spent(session, job.id)
    if need > held and left > held:
        team = lock_team(session, job.team_id)
        top_up = min(need - held, left - held, max(team_budget(session, team, now).available, 0))
        if top_up > 0:
            reserve(session, team, job, top_up, now)
            held += top_up
    money = attempt.cost_micros + max(min(need, held, left), 0)
    # The longest billed time that money pays for, as an end time (per-second billing).
    seconds = math.inf if price <= 0 else money * 3600 / price
    assert attempt.started_at is not None
    until = min(
        now + timedelta(seconds=horizon_seconds), attempt.started_at + timedelta(seconds=seconds)
    )
    attempt.lease_until = max(until, attempt.lease_until or until)
    session.add(attempt)
    return max((attempt.lease_until - now).total_seconds(), 0.0)


def warn_on_alert(session: Session, job: Job, booked: int, now: datetime) -> None:
    """Log a warning when this booking takes the team's spend past its alert threshold."""
    team = session.get(Team, job.team_id)
    if team is None:
        return
    figures = team_budget(session, team, now)
    threshold = figures.alert_at * figures.limit
    if figures.spent - booked < threshold <= figures.spent:
        log.warning(
            "team %s passed its budget alert: %s of %s USD spent",
            team.name,
            format_usd(figures.spent),
            format_usd(figures.limit),
            extra={"team_id": team.id, "job_id": job.id},
        )
