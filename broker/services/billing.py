"""What a running attempt costs: per-second billing with the provider's minimum, booked to
the ledger as it accrues, and the team's budget alert.

These helpers run inside a ``lifecycle`` transaction that holds the job's row; the state
changes that call them (``lifecycle.accrue`` and the functions that end an attempt) decide
when an attempt is billed.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlmodel import Session

from broker.core.money import cost_micros, format_usd
from broker.db.models import Attempt, Job, Team
from broker.services.ledger import book_spend, team_budget

log = logging.getLogger(__name__)

MIN_BILLED_SECONDS = {"aws": 60.0, "gcp": 60.0}


def billed_seconds(attempt: Attempt, until: datetime) -> float:
    """Seconds billed for a started attempt up to ``until`` (per second, provider minimum)."""
    if attempt.started_at is None:
        return 0.0
    elapsed = max((until - attempt.started_at).total_seconds(), 0.0)
    return max(elapsed, MIN_BILLED_SECONDS.get(attempt.provider, 60.0))


def bill(session: Session, job: Job, attempt: Attempt, now: datetime) -> int:
    """Book what a running attempt has cost since its last booking; returns the new amount."""
    # Billing never runs backwards: a worker that read the clock before another booked a
    # later time must not leave billed_seconds short of what cost_micros already holds.
    seconds = max(billed_seconds(attempt, now), attempt.billed_seconds)
    total = cost_micros(attempt.price_micros_per_hour, seconds)
    delta = total - attempt.cost_micros
    attempt.billed_seconds = seconds
    if delta > 0:
        attempt.cost_micros = total
        book_spend(session, job, attempt, delta, now)
    session.add(attempt)
    return max(delta, 0)


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
