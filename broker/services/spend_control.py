"""Spend control in the control loop: spend leases renewed by the beat, and live-attempt limits.

Every running attempt holds a spend lease (``billing.renew_lease``). The beat's tick first
sweeps the attempts whose lease ends within the renewal window, nearest first, and renews
each within its job's money (``lifecycle.accrue``), before any per-attempt observation is
sent to the workers: so when observations queue up, spend is still booked and bounded, and
an attempt whose lease lapses is stopped. Launches wait (the job stays ``queued`` or
``preempted``) while its team, or the whole broker, has as many live attempts as allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.db.models import Attempt
from broker.services.lifecycle import LAUNCHING, RUNNING

LIVE = (LAUNCHING, RUNNING)


@dataclass(frozen=True)
class SpendControls:
    """How far spend is granted ahead and how many attempts may be live at once."""

    lease_seconds: float = 600.0  # broker seconds, at least
    lease_ticks: float = 6.0  # ... and at least this many ticks
    renew_ticks: float = 2.0  # the sweep renews leases ending within this many ticks
    max_live_per_team: int = 32
    max_live_total: int = 1000

    def lease(self, tick_broker_seconds: float) -> float:
        """The lease granted at each renewal, in broker seconds."""
        return max(self.lease_seconds, self.lease_ticks * tick_broker_seconds)


LOOKAHEAD_TICKS = 2.0
"""A running attempt's money must cover this many ticks ahead, else its job stops."""


def lookahead_seconds(tick_broker_seconds: float) -> float:
    """The broker seconds of spend an attempt's money must cover to run on: the lease sweep,
    each observation and a lapsed-lease report ask the same."""
    return LOOKAHEAD_TICKS * tick_broker_seconds


def leases_due(session: Session, now: datetime, window_seconds: float) -> list[str]:
    """Running attempts whose lease ends within ``window_seconds`` (or has none), nearest
    first: the ones the sweep must renew, or stop, now."""
    edge = now + timedelta(seconds=window_seconds)
    lease = col(Attempt.lease_until)
    query = (
        select(Attempt.id)
        .where(Attempt.status == RUNNING, lease.is_(None) | (lease <= edge))
        .order_by(lease.asc().nulls_first(), col(Attempt.id))
    )
    return list(session.exec(query).all())


def lapsed(session: Session, now: datetime) -> tuple[int, float]:
    """How many running attempts are past their lease, and by how many seconds at most:
    non-zero means the control loop is behind."""
    oldest = session.exec(
        select(func.count(), func.min(Attempt.lease_until)).where(
            Attempt.status == RUNNING, col(Attempt.lease_until) < now
        )
    ).one()
    count, first = oldest
    return int(count), (now - first).total_seconds() if first is not None else 0.0


def live_counts(session: Session) -> dict[str, int]:
    """Live (launching or running) attempts per team."""
    rows = session.exec(
        select(Attempt.team_id, func.count())
        .where(col(Attempt.status).in_(LIVE))
        .group_by(col(Attempt.team_id))
    ).all()
    return {team: int(n) for team, n in rows}


def may_launch(controls: SpendControls, counts: dict[str, int], team_id: str) -> bool:
    """Whether a job of ``team_id`` may start an attempt now, given the live ``counts``."""
    return (
        counts.get(team_id, 0) < controls.max_live_per_team
        and sum(counts.values()) < controls.max_live_total
    )
