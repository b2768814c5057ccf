"""What admission reserves for a job: a proven upper bound of what its policy may spend.

Pure arithmetic in any money unit (prices per hour times hours; the services pass
micro-dollars, the simulator dollars). The figures of one job:

- ``W`` work hours at the plan's speed, ``R`` restart hours (launch, setup, restore),
  ``tick`` the broker's decision interval, ``po`` / ``ps`` the on-demand / spot price of the
  plan's offer, ``O`` the on-demand-only cost (``po x (W + R)`` unless given: the quote's
  cheapest on-demand plan).
- ``on_demand``-market job: ``min(max_cost, po x (W + R))``: one start (or restart) and the
  work, on a market that never takes the instance away.
- ``spot``-market job: the planner's worst case (spot for its whole window), within max_cost.
- ``auto`` job: ``C = min(max_cost, max(po x (W + R + tick), RESERVE_FACTOR x O))``.

Why ``C`` bounds an ``auto`` job's spend, on the simulator's model (``broker.sim.simulator``:
one instance at a time, each held tick paid at its price, a start or switch costs ``R``
without progress, on-demand always obtainable and never lost). The policy's budget net
(``broker.core.policy.budget_net``, with ``reserved = C``) allows any choice but holding
on-demand (keep or start spot at ``ps``, hold nothing at 0) only while

    spent + price x tick + po x (work_left + R + tick) <= C,

and takes (or keeps) on-demand otherwise. Then the invariant

    J:  spent + po x (work_left + pending) <= C,   pending = restart left on on-demand, else R

holds at every decision. At the start ``J`` is ``po x (W + R) <= C``, true by the choice of
``C``. A tick on on-demand pays ``po x tick`` and cuts ``pending`` or ``work_left`` by a tick:
``J``'s left side is unchanged; switching to on-demand sets ``pending = R``: unchanged. Any
other tick passed the net, so after it (``spent`` up by ``price x tick`` at most, work left
not up, ``pending = R``, whether spot runs, is lost or nothing runs) ``J`` holds with
``po x tick`` to spare. When the work is done ``spent <= C - po x pending <= C``; a job still
short at its deadline is finished on on-demand for ``po x (work_left + pending)``, within
``C`` too. The bound needs only ``C >= po x (W + R)``, so the cap ``max_cost`` keeps it as
long as it is at least that (the planner keeps plans whose worst case fits max_cost, and live
the spend leases never grant past it). ``RESERVE_FACTOR`` leaves spot room to pay for its
restarts: the net binds only on runs whose spot time has already cost half an on-demand run.

The deadline: the net only ever replaces a choice by on-demand, and a job it put there
stays (paying the restart only raises the net's left side) and runs to the end. The policies
keep, on spot or idle, time for an on-demand start (a spot start needs slack >= 2 ``R``, a
spot tick never lowers the slack, an idle job starts on-demand while slack >= ``R``), so the
net trades no deadline for the bound (``tests/sim/test_reservation_bound.py``).

Live, going on-demand means re-planning the work left on the cheapest on-demand plan that
still meets the deadline, often another offer (a slower GPU that is cheaper per unit of work)
than the spot plan's. So ``po`` and ``W`` are that plan's (the quote's cheapest on-demand
plan, whose cost is ``O``), and the net's ``po x (work_left + R + tick)`` is that plan's cost
for the work left, started a tick from now (``PolicyState.on_demand_cost``): the argument is
the same, with the cheapest on-time plan of each moment (it only grows dearer as the deadline
nears, and the net looks a tick ahead). The bound is as good as its inputs: prices that move,
work lost since the latest checkpoint (the policy counts work from it, which keeps ``J`` on
the safe side), billing minimums and a control loop that observes late (the tick of margin)
make it approximate; the spend leases (``broker.services.billing``) remain the hard stop.

Holds: where the caller can raise ``C`` (``PolicyState.reserve_limit``: live, up to the
job's max_cost from its team's free budget), the net asks for that rather than take
on-demand (``policy.Decision.hold``). Raising ``C`` before a tick only adds slack to ``J``,
so the argument holds with the ``C`` of each moment, and spend stays within the last one.
"""

from __future__ import annotations

from typing import Literal

RESERVE_FACTOR = 1.5  # x the on-demand-only cost: room for spot's restarts


def on_demand_cost(on_demand_price: float, work_hours: float, restart_hours: float) -> float:
    """One start on on-demand and the work: ``po x (W + R)``."""
    return on_demand_price * (work_hours + restart_hours)


def reservation(
    market: Literal["auto", "spot", "on_demand"],
    *,
    on_demand_price: float,
    work_hours: float,
    restart_hours: float,
    tick_hours: float,
    max_cost: float,
    on_demand_only: float | None = None,
    spot_worst_case: float | None = None,
    factor: float = RESERVE_FACTOR,
) -> float:
    """The reservation of a job on one offer, in the prices' unit (see the module docstring).

    ``on_demand_only``: the job's on-demand-only cost (default ``po x (W + R)`` on this
    offer); ``spot_worst_case``: the planner's worst case, required for the ``spot`` market;
    ``factor`` 0: the least an ``auto`` job may hold, ``po x (W + R + tick)``.
    """
    if market == "spot":
        if spot_worst_case is None:
            raise ValueError("a spot-market reservation needs the planner's spot worst case")
        return min(max_cost, spot_worst_case)
    alone = on_demand_cost(on_demand_price, work_hours, restart_hours)
    if market == "on_demand":
        return min(max_cost, alone)
    needed = on_demand_price * (work_hours + restart_hours + tick_hours)
    reference = alone if on_demand_only is None else on_demand_only
    return min(max_cost, max(needed, factor * reference))
