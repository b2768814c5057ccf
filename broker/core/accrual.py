"""What booking a running attempt's spend and renewing its lease come to (pure; micro-dollars).

The arithmetic of ``broker.services.billing``, apart from the reads and writes around it, so
that one attempt (``lifecycle.accrue``) and a batch of them (``services.accrual``) book and
grant exactly the same amounts. Per-second billing with the provider's minimum; a booking
never runs backwards; what passes the lease is an overrun; a lease is the longest billed time
the money set aside pays for, never past ``now + horizon``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.core.money import cost_micros


def billed_seconds(started_at: datetime | None, until: datetime, minimum: float) -> float:
    """Seconds billed for an instance started at ``started_at`` up to ``until`` (per second,
    ``minimum`` at least; nothing before it starts)."""
    if started_at is None:
        return 0.0
    return max((until - started_at).total_seconds(), 0.0, minimum)


@dataclass(frozen=True)
class Booking:
    """One booking of an attempt: its billed seconds and total cost after it, and what it
    books as spend (within the lease) and as overrun (past it)."""

    billed_seconds: float
    cost_micros: int
    spend: int
    overrun: int


def booking(
    price_micros_per_hour: int,
    started_at: datetime | None,
    minimum_seconds: float,
    billed_before: float,
    cost_before: int,
    lease_until: datetime | None,
    now: datetime,
) -> Booking:
    """What an attempt has cost since its last booking, split at its lease's end."""
    # Billing never runs backwards: a worker that read the clock before another booked a
    # later time must not leave billed_seconds short of what cost_micros already holds.
    seconds = max(billed_seconds(started_at, now, minimum_seconds), billed_before)
    total = cost_micros(price_micros_per_hour, seconds)
    granted = total
    if lease_until is not None:
        granted = cost_micros(
            price_micros_per_hour, billed_seconds(started_at, lease_until, minimum_seconds)
        )
    spend = max(min(total, granted) - cost_before, 0)
    overrun = max(total - cost_before - spend, 0)
    return Booking(seconds, total if spend or overrun else cost_before, spend, overrun)


def lease_need(
    price_micros_per_hour: int,
    started_at: datetime | None,
    minimum_seconds: float,
    cost_now: int,
    now: datetime,
    horizon_seconds: float,
) -> int:
    """What running on to ``now + horizon_seconds`` costs beyond what is already booked."""
    until = now + timedelta(seconds=horizon_seconds)
    return (
        cost_micros(price_micros_per_hour, billed_seconds(started_at, until, minimum_seconds))
        - cost_now
    )


def lease_end(
    price_micros_per_hour: int,
    started_at: datetime,
    cost_now: int,
    money: int,
    lease_before: datetime | None,
    now: datetime,
    horizon_seconds: float,
) -> datetime:
    """The lease's new end: the longest billed time ``cost_now + money`` pays for, within
    ``now + horizon_seconds``; a lease never shrinks."""
    paid = cost_now + max(money, 0)
    seconds = math.inf if price_micros_per_hour <= 0 else paid * 3600 / price_micros_per_hour
    horizon = now + timedelta(seconds=horizon_seconds)
    until = (
        horizon if math.isinf(seconds) else min(horizon, started_at + timedelta(seconds=seconds))
    )
    return max(until, lease_before or until)
