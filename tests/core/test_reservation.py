"""The reservation bound, and the budget net that keeps the policies within it."""

from __future__ import annotations

import math

import pytest

from broker.core.policy import (
    CONTINUE,
    ON_DEMAND,
    WAIT,
    Action,
    Decision,
    Instance,
    PolicyState,
    budget_net,
    greedy,
    net_need,
)
from broker.core.reservation import RESERVE_FACTOR, reservation

FIGURES = {"on_demand_price": 3.0, "work_hours": 10.0, "restart_hours": 0.2, "tick_hours": 0.1}


def test_an_auto_job_reserves_one_and_a_half_on_demand_runs_at_least_one_and_a_tick() -> None:
    unbounded = math.inf
    assert reservation("auto", **FIGURES, max_cost=unbounded) == pytest.approx(1.5 * 30.6)
    assert RESERVE_FACTOR == 1.5
    assert reservation("auto", **FIGURES, max_cost=unbounded, on_demand_only=22.0) == 33.0
    # a cheap on-demand-only figure never takes it below on-demand for all the work and a tick
    floor = pytest.approx(3.0 * 10.3)
    assert reservation("auto", **FIGURES, max_cost=unbounded, on_demand_only=1.0) == floor
    assert reservation("auto", **FIGURES, max_cost=unbounded, factor=0.0) == floor
    assert reservation("auto", **FIGURES, max_cost=25.0) == 25.0


def test_on_demand_jobs_reserve_a_run_and_spot_jobs_their_worst_case() -> None:
    assert reservation("on_demand", **FIGURES, max_cost=math.inf) == pytest.approx(30.6)
    assert reservation("spot", **FIGURES, max_cost=50.0, spot_worst_case=12.0) == 12.0
    assert reservation("spot", **FIGURES, max_cost=10.0, spot_worst_case=12.0) == 10.0
    with pytest.raises(ValueError, match="worst case"):
        reservation("spot", **FIGURES, max_cost=10.0)


def state(**changes: object) -> PolicyState:
    """10 h of work left, 0.2 h restart, 0.1 h ticks: on-demand for the rest costs $30.9."""
    base = PolicyState(
        hours_to_deadline=20.0,
        hours_total=20.0,
        work_left_hours=10.0,
        work_total_hours=10.0,
        restart_hours=0.2,
        tick_hours=0.1,
        zones=("z",),
        spot_obtainable=(True,),
        spot_price=1.0,
        on_demand_price=3.0,
        spent=5.0,
    )
    return base.with_(**changes)


SPOT = Decision(Action.SPOT, "z")


def test_the_net_lets_spot_run_while_the_reservation_covers_on_demand_for_the_rest() -> None:
    enough = state(reserved=5.0 + 0.1 + 30.9 + 1e-9)
    assert budget_net(enough, SPOT) == SPOT
    assert budget_net(enough.with_(instance=Instance.SPOT, zone="z"), CONTINUE) == CONTINUE
    assert budget_net(state(), SPOT) == SPOT  # no reservation given: no net


def test_the_net_puts_a_job_short_of_money_on_on_demand_and_keeps_it_there() -> None:
    short = state(reserved=5.0 + 0.1 + 30.9 - 1e-9)
    assert budget_net(short, SPOT) == ON_DEMAND
    assert budget_net(short.with_(instance=Instance.SPOT, zone="z"), CONTINUE) == ON_DEMAND
    on_demand = short.with_(instance=Instance.ON_DEMAND)
    assert budget_net(on_demand, SPOT) == CONTINUE
    assert budget_net(on_demand.with_(reserved=5.0 + 30.9 - 1e-9), WAIT) == CONTINUE
    assert budget_net(on_demand, WAIT) == WAIT  # holding nothing costs nothing: it still fits
    assert budget_net(short, Decision(Action.STOP)) == Decision(Action.STOP)


def test_the_net_asks_to_hold_more_rather_than_leave_spot_when_the_limit_allows() -> None:
    need = 5.0 + 0.1 + 30.9  # spent, a tick of spot, on-demand to the end
    short = state(reserved=need - 1.0, instance=Instance.SPOT, zone="z")
    kept = budget_net(short.with_(reserve_limit=100.0), CONTINUE)
    # the same decision, asking to hold the need and an hour of spot ahead
    assert (kept.action, kept.hold) == (Action.CONTINUE, pytest.approx(need + 1.0))
    # up to the limit, not past it
    assert budget_net(short.with_(reserve_limit=need + 0.5), CONTINUE).hold == need + 0.5
    # a limit below the need: on-demand, as without one
    assert budget_net(short.with_(reserve_limit=need - 1e-9), CONTINUE) == ON_DEMAND
    # holding nothing asks for no spot hour; a reservation that covers it asks for nothing
    waiting = budget_net(state(reserved=5.0, reserve_limit=100.0), WAIT)
    assert (waiting.action, waiting.hold) == (Action.WAIT, pytest.approx(5.0 + 30.9))
    assert budget_net(state(reserved=need, reserve_limit=100.0), SPOT) == SPOT
    assert net_need(short, CONTINUE) == pytest.approx(need)
    assert net_need(short.with_(instance=Instance.ON_DEMAND), CONTINUE) is None


def test_the_net_prices_on_demand_as_the_caller_says_when_it_knows_better() -> None:
    # live, going on-demand may mean a cheaper offer than the plan's (a slower GPU)
    cheap = state(reserved=20.0, on_demand_cost=14.8)
    assert budget_net(cheap, SPOT) == SPOT
    assert budget_net(cheap.with_(on_demand_cost=15.0), SPOT) == ON_DEMAND


def test_greedy_under_the_net_starts_on_demand_rather_than_spot() -> None:
    assert greedy(state(reserved=100.0)) == SPOT
    assert greedy(state(reserved=30.0)) == ON_DEMAND
