"""A job's on-demand-only cost, booked as its spend is (pure; micro-dollars).

What spot saves is measured against this figure, so it is priced with the rules that book real
spend (``broker.services.billing``): one on-demand attempt billed per second from the moment
its instance runs (start-up and setup billed, no restore on a first start) to the end of its
work, at least the provider's minimum, rounded up to a whole micro-dollar like every booking
(``money.cost_micros``). The planner's checkpoint write time is left out: whatever a program
spends writing checkpoints it spends on any market, and a figure that counted it where the
program writes in no time (the local clouds) would credit spot with savings it did not make.
The figure runs at the plan's speed, the throughput model's with what the broker has learnt
(``calibration``); a GPU that turns out slower than that costs more than the figure says.
"""

from __future__ import annotations

from broker.core.job_status import is_terminal
from broker.core.money import cost_micros
from broker.core.planner import Plan


def on_demand_only_cost(
    price_per_hour_micros: int,
    *,
    startup_hours: float,
    work_hours: float,
    min_billed_seconds: float,
) -> int:
    """Micro-dollars one on-demand attempt at ``price_per_hour_micros`` is booked for: its
    start-up and ``work_hours`` of work, billed per second, ``min_billed_seconds`` at least."""
    hours = max(startup_hours, 0.0) + max(work_hours, 0.0)
    return cost_micros(price_per_hour_micros, max(hours * 3600.0, min_billed_seconds))


def plan_on_demand_only(
    plan: Plan,
    *,
    startup_hours: float,
    interval_hours: float,
    write_hours: float,
    min_billed_seconds: float,
) -> int:
    """``on_demand_only_cost`` of an on-demand ``plan`` (the quote's cheapest on-time one):
    its work hours are its expected hours less the start-up and the checkpoint writes the
    planner added to them (``s + C + C / interval x write``)."""
    per_hour = 1.0 + (write_hours / interval_hours if interval_hours > 0 else 0.0)
    return on_demand_only_cost(
        plan.price_per_hour_micros,
        startup_hours=startup_hours,
        work_hours=max(plan.expected_hours - startup_hours, 0.0) / per_hour,
        min_billed_seconds=min_billed_seconds,
    )


def on_demand_saving(status: str, on_demand_only: int | None, spent: int) -> int | None:
    """What a finished job saved against its on-demand-only cost (negative: it cost more);
    None while it runs or without that figure."""
    if on_demand_only is None or not is_terminal(status):
        return None
    return on_demand_only - spent
