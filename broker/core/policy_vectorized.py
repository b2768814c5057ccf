"""The rules of ``broker.core.policy`` on numpy arrays: one decision per job, many jobs at once.

The simulator runs every start offset of a job in lockstep and asks these for all of them in
one call per tick. Each function here is the same rule as its namesake in ``broker.core.policy``
(``tests/core/test_policy.py`` checks they agree on random states).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps

import numpy as np

from broker.core.policy import (
    EPS,
    Action,
    AvailabilityHistory,
    Instance,
    PolicyState,
    ZoneHistory,
    spot_now,
    spot_pays,
    window_estimate,
)
from broker.core.spot_chain import chain_state
from broker.core.spot_mdp import SpotPlan


@dataclass
class BatchState:
    """``PolicyState`` for B jobs: (B,) arrays, (Z, B) per zone; prices shared."""

    hours_to_deadline: np.ndarray
    hours_total: np.ndarray
    work_left_hours: np.ndarray
    work_total_hours: np.ndarray
    restart_hours: np.ndarray
    tick_hours: np.ndarray
    instance: np.ndarray  # int, Instance values
    zone: np.ndarray  # int index into zones, -1 = none
    restart_left_hours: np.ndarray
    spot_obtainable: np.ndarray  # (Z, B) bool
    spot_price: float
    on_demand_price: float
    observed_hours: np.ndarray  # (Z, B) history, as ZoneHistory fields
    available_hours: np.ndarray
    windows: np.ndarray
    last_available: np.ndarray
    zones: tuple[str, ...]
    age_hours: np.ndarray | None = None  # (Z, B) how long each zone's state has lasted
    # the ``broker`` policy's plans: job b follows chain plan_row[b] of plans[plan_of[b]]
    plans: tuple[SpotPlan, ...] = ()
    plan_of: np.ndarray | None = None
    plan_row: np.ndarray | None = None
    # spend so far and the whole reservation (B,), in the prices' unit; None: no budget net
    spent: np.ndarray | None = None
    reserved: np.ndarray | None = None
    unsaved_hours: np.ndarray | None = None  # (B,) work since the checkpoint; None: 0

    @property
    def slack_hours(self) -> np.ndarray:
        return self.hours_to_deadline - self.work_left_hours - self.restart_left_hours

    def row(self, b: int) -> PolicyState:
        """Job ``b`` as a scalar ``PolicyState``."""
        zone = int(self.zone[b])
        history = AvailabilityHistory(
            {
                name: ZoneHistory(
                    float(self.observed_hours[z, b]),
                    float(self.available_hours[z, b]),
                    int(self.windows[z, b]),
                    bool(self.last_available[z, b]),
                    age_hours=float(self.age_hours[z, b]) if self.age_hours is not None else 0.0,
                )
                for z, name in enumerate(self.zones)
            }
        )
        return PolicyState(
            hours_to_deadline=float(self.hours_to_deadline[b]),
            hours_total=float(self.hours_total[b]),
            work_left_hours=float(self.work_left_hours[b]),
            work_total_hours=float(self.work_total_hours[b]),
            restart_hours=float(self.restart_hours[b]),
            tick_hours=float(self.tick_hours[b]),
            instance=Instance(int(self.instance[b])),
            zone=self.zones[zone] if zone >= 0 else None,
            restart_left_hours=float(self.restart_left_hours[b]),
            unsaved_hours=float(self.unsaved_hours[b]) if self.unsaved_hours is not None else 0.0,
            zones=self.zones,
            spot_obtainable=tuple(bool(x) for x in self.spot_obtainable[:, b]),
            spot_price=self.spot_price,
            on_demand_price=self.on_demand_price,
            history=history,
            plan=self.plans[int(self.plan_of[b])] if self.plan_of is not None else None,
            plan_row=int(self.plan_row[b]) if self.plan_row is not None else 0,
            spent=float(self.spent[b]) if self.spent is not None else 0.0,
            reserved=float(self.reserved[b]) if self.reserved is not None else math.inf,
        )


BatchDecision = tuple[np.ndarray, np.ndarray]  # (action codes, zone index or -1)
BatchPolicy = Callable[[BatchState], BatchDecision]


def first_spot_zone(obtainable: np.ndarray) -> np.ndarray:
    """Index of the first zone with spot obtainable, -1 where none."""
    return np.where(obtainable.any(axis=0), obtainable.argmax(axis=0), -1)


def spot_is_safe(s: BatchState) -> np.ndarray:
    return s.slack_hours >= 2 * s.restart_hours - EPS


def cannot_wait(s: BatchState) -> np.ndarray:
    return s.slack_hours - s.tick_hours < 2 * s.restart_hours - EPS


def last_moment(s: BatchState) -> np.ndarray:
    return s.slack_hours - s.tick_hours < s.restart_hours - EPS


def by_instance(
    s: BatchState,
    od_action: np.ndarray,
    idle_action: np.ndarray,
    zone: np.ndarray,
    spot_action: np.ndarray | int = Action.CONTINUE,
) -> BatchDecision:
    """Take ``spot_action`` on spot (keep it by default), ``od_action`` on on-demand,
    ``idle_action`` with no instance; stop when the work is done."""
    action = np.select(
        [s.instance == Instance.SPOT, s.instance == Instance.ON_DEMAND],
        [spot_action, od_action],
        idle_action,
    )
    action = np.where(s.work_left_hours <= EPS, Action.STOP, action)
    return action.astype(np.int8), np.where(action == Action.SPOT, zone, -1)


def budget_net_batch(s: BatchState, decision: BatchDecision) -> BatchDecision:
    """``policy.budget_net``: on-demand (started or kept) where a tick on spot or on nothing
    would leave the reservation short of the on-demand run."""
    if s.reserved is None:
        return decision
    action, zone = decision
    keep = action == Action.CONTINUE
    spot = (action == Action.SPOT) | (keep & (s.instance == Instance.SPOT))
    none = (action == Action.WAIT) | (keep & (s.instance == Instance.NONE))
    tick = s.tick_hours
    finish = s.on_demand_price * (s.work_left_hours + s.restart_hours + tick)
    spent = s.spent if s.spent is not None else 0.0
    need = spent + np.where(spot, s.spot_price, 0.0) * tick + finish
    over = (spot | none) & (need > s.reserved)
    held_od = s.instance == Instance.ON_DEMAND
    action = np.where(over, np.where(held_od, Action.CONTINUE, Action.ON_DEMAND), action)
    return action.astype(np.int8), np.where(action == Action.SPOT, zone, -1)


def _netted(rule: BatchPolicy) -> BatchPolicy:
    """``rule`` under the budget net."""

    @wraps(rule)
    def netted(s: BatchState) -> BatchDecision:
        return budget_net_batch(s, rule(s))

    return netted


def on_demand_batch(s: BatchState) -> BatchDecision:
    action = np.where(s.instance == Instance.ON_DEMAND, Action.CONTINUE, Action.ON_DEMAND)
    action = np.where(s.work_left_hours <= EPS, Action.STOP, action)
    return action.astype(np.int8), np.full(action.shape, -1)


@_netted
def greedy_batch(s: BatchState) -> BatchDecision:
    zone = first_spot_zone(s.spot_obtainable)
    take_spot = (zone >= 0) & spot_is_safe(s)
    idle_action = np.where(
        take_spot, Action.SPOT, np.where(cannot_wait(s), Action.ON_DEMAND, Action.CONTINUE)
    )
    action = np.where(s.instance == Instance.NONE, idle_action, Action.CONTINUE)
    action = np.where(s.work_left_hours <= EPS, Action.STOP, action)
    return action.astype(np.int8), np.where(action == Action.SPOT, zone, -1)


@_netted
def uniform_progress_batch(s: BatchState) -> BatchDecision:
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(s.hours_total > 0, s.work_total_hours / s.hours_total, np.inf)
    elapsed = s.hours_total - s.hours_to_deadline
    done = s.work_total_hours - s.work_left_hours
    zone = first_spot_zone(s.spot_obtainable)
    has_zone = zone >= 0
    must = cannot_wait(s)
    hold_od = must | (done < rate * (elapsed + 2 * s.restart_hours) - EPS)
    od_action = np.where(~hold_od & has_zone, Action.SPOT, Action.CONTINUE)
    behind = must | (done < rate * elapsed - EPS)
    idle_action = np.where(
        has_zone & spot_is_safe(s),
        Action.SPOT,
        np.where(behind, Action.ON_DEMAND, Action.CONTINUE),
    )
    return by_instance(s, od_action, idle_action, zone)


@_netted
def broker_batch(s: BatchState) -> BatchDecision:
    """``policy.broker``; needs ``s.plans`` (the simulator solves them before the jobs start)."""
    if s.plan_of is None or s.plan_row is None or s.age_hours is None:
        raise ValueError("the broker policy needs plans and the zones' ages")
    ages = np.where(s.last_available == s.spot_obtainable, s.age_hours, 0.0)
    up, age = spot_now(s.spot_obtainable, ages)
    elapsed = s.hours_total - s.hours_to_deadline
    done = s.work_total_hours - s.work_left_hours
    want = np.full(len(up), -1, np.int64)
    for k, plan in enumerate(s.plans):
        on = s.plan_of == k
        want[on] = plan.lookup(
            s.plan_row[on],
            elapsed[on],
            done[on],
            s.instance[on].astype(np.int64),
            chain_state(up[on], age[on], plan.step_hours, plan.edges),
        )
    window = window_estimate(s.available_hours, s.windows)  # (Z, B)
    zone = np.where(
        s.spot_obtainable.any(axis=0), np.where(s.spot_obtainable, window, -1.0).argmax(axis=0), -1
    )
    spot_ok = (zone >= 0) & spot_is_safe(s)
    must = (want < 0) | last_moment(s)
    to_spot = (want == Instance.SPOT) & spot_ok
    zone_window = window[np.maximum(zone, 0), np.arange(len(zone))]
    unsaved = s.unsaved_hours if s.unsaved_hours is not None else 0.0
    pays = spot_pays(
        s.spot_price,
        s.on_demand_price,
        zone_window,
        s.work_left_hours,
        s.restart_hours,
        unsaved,
    )
    spot_action = np.select(
        [want == Instance.ON_DEMAND, (want == Instance.NONE) & ~must],
        [Action.ON_DEMAND, Action.WAIT],
        Action.CONTINUE,
    )
    od_action = np.select(
        [must, to_spot & pays, want == Instance.NONE],
        [Action.CONTINUE, Action.SPOT, Action.WAIT],
        Action.CONTINUE,
    )
    idle_action = np.select(
        [to_spot, must | (want == Instance.ON_DEMAND)],
        [Action.SPOT, Action.ON_DEMAND],
        Action.CONTINUE,
    )
    starting = s.restart_left_hours > EPS  # a start under way is paid for: see it through
    return by_instance(
        s,
        np.where(starting, Action.CONTINUE, od_action),
        idle_action,
        zone,
        np.where(starting, Action.CONTINUE, spot_action),
    )


BATCH_POLICIES: dict[str, BatchPolicy] = {
    "on_demand": on_demand_batch,
    "greedy": greedy_batch,
    "uniform_progress": uniform_progress_batch,
    "broker": broker_batch,
}
