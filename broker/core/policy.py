"""Spot / on-demand policies: what a job should run on next, decided from what the broker knows.

Pure: no I/O, no clock. The live broker (``broker.services``) and the trace simulator
(``broker.sim.simulator``) call the same rules; ``broker.core.policy_vectorized`` writes each
rule again on numpy arrays for the simulator, and a test holds the two to the same answers.

``PolicyState`` fields, all hours unless said (the caller fills them on every monitoring tick):

- ``hours_to_deadline``: deadline minus now.
- ``hours_total``: deadline minus the job's start (so elapsed = hours_total - hours_to_deadline).
- ``work_left_hours`` / ``work_total_hours``: compute hours left / in total, at the current
  plan's speed (work left counts from the latest checkpoint the job can resume from).
- ``restart_hours``: the restart overhead of any start or switch (launch, setup, restore).
- ``restart_left_hours``: overhead the current instance still has to pay before it makes
  progress (0 once it reports progress, or when nothing runs).
- ``unsaved_hours``: work done since the latest checkpoint, that leaving the instance loses
  (0 in the simulator, whose jobs keep all their progress).
- ``tick_hours``: time until the broker asks again (its monitoring interval).
- ``instance``: what runs now (``Instance.NONE`` after a preemption), ``zone``: where the spot
  instance runs (None otherwise).
- ``zones`` and ``spot_obtainable``: the candidate zones, in order of preference, and per zone
  whether spot can be had now as far as the broker knows (a launch failed with a capacity
  error -> False; it was preempted there -> False; the current spot zone -> True).
- ``spot_price`` / ``on_demand_price``: $/h of the plan's instance.
- ``spent`` / ``reserved``: what the job has spent so far and the whole of its reservation
  (spent included), in the prices' money unit; the budget net (``budget_net``) keeps spent
  within ``reserved``. The default ``reserved`` (infinite) turns the net off.
- ``reserve_limit``: the most the caller could hold for the job (live: its ``max_cost``; the
  team's free budget is checked when it holds); None: ``reserved``, nothing more. Above
  ``reserved``, the net asks for more rather than force on-demand (``Decision.hold``).
- ``on_demand_cost``: what finishing on on-demand costs if it starts a tick from now, a tick
  of margin included; None: ``on_demand_price x (work_left + restart + tick)`` (one offer,
  as simulated). Live it is the cheapest on-demand plan for the work left, which may be
  another offer than the plan's.
- ``history``: ``AvailabilityHistory`` of what the broker has seen per zone (the lengths of
  its windows and outages, and how long the current one has lasted); update it with
  ``history.observe(zone, available, hours)`` (a new value) whenever you learn a zone's state.
- ``plan`` / ``plan_row``: the ``broker`` policy's ``SpotPlan`` (``broker.core.spot_mdp``) and the
  chain in it this job follows; None: solved from ``history`` when asked (and cached).

``Decision``: ``Action.CONTINUE`` (keep what runs, or keep waiting), ``SPOT`` in ``zone``
(start there, or move there), ``ON_DEMAND``, ``WAIT`` (no instance: terminate what runs) or
``STOP`` (work done).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import wraps
from typing import Any, TypeVar, cast

import numpy as np

from broker.core.plan_cache import PlanCache
from broker.core.spot_chain import chain_state, fit_chain
from broker.core.spot_mdp import (
    SpotPlan,
    job_plan,
    plan_step_hours,
    plan_steps,
    price_ratio,
    shared_steps,
    solve,
)

EPS = 1e-9  # hours; float noise on tick multiples, far below one tick
PRIOR_HOURS = 24.0  # weight of the prior in availability estimates
PRIOR_AVAILABILITY = 0.5
PRIOR_WINDOW_HOURS = 2.0
SWITCH_MARGIN = 1.5  # leaving on-demand for spot must pay this many times the work it loses
HISTORY_DAYS = 30.0  # the spot availability history the broker keeps (and plans on)
# How long news that a zone has no spot holds: a zone that refused or preempted spot this
# recently is taken as out of it, then tried anew ...
REFUSED_HOURS = 1.0
MOVE_BACK_HOURS = 3.0  # ... and this long for leaving a running on-demand instance for it

_Hours = TypeVar("_Hours", float, np.ndarray)  # the estimates take floats or arrays alike


class Instance(IntEnum):
    NONE = 0
    SPOT = 1
    ON_DEMAND = 2


class Action(IntEnum):
    CONTINUE = 0
    SPOT = 1
    ON_DEMAND = 2
    WAIT = 3
    STOP = 4


@dataclass(frozen=True)
class Decision:
    """What to do now; ``zone`` only for ``Action.SPOT``. ``hold``: the reservation (spent
    included) the decision needs when that is more than ``PolicyState.reserved`` (0: none):
    the caller holds it before acting, or, when it cannot, asks again without
    ``reserve_limit`` (the budget net then takes on-demand)."""

    action: Action
    zone: str | None = None
    hold: float = 0.0


@dataclass(frozen=True)
class ZoneHistory:
    """Spot seen in one zone: hours observed, hours available, available windows begun, the
    lengths of the windows and outages that ended, and how long the current one has lasted."""

    observed_hours: float = 0.0
    available_hours: float = 0.0
    windows: int = 0
    last_available: bool = False
    up_runs: tuple[float, ...] = ()
    down_runs: tuple[float, ...] = ()
    age_hours: float = 0.0


@dataclass(frozen=True)
class AvailabilityHistory:
    """Per-zone summary of spot availability seen so far (a value; ``observe`` returns anew)."""

    zones: dict[str, ZoneHistory] = field(default_factory=dict)

    def observe(self, zone: str, available: bool, hours: float) -> AvailabilityHistory:
        """The history after seeing ``zone`` available (or not) for ``hours``."""
        seen = self.zones.get(zone, ZoneHistory())
        same = available == seen.last_available
        ended = () if same or seen.age_hours <= 0 else (seen.age_hours,)
        updated = ZoneHistory(
            observed_hours=seen.observed_hours + hours,
            available_hours=seen.available_hours + (hours if available else 0.0),
            windows=seen.windows + int(available and not seen.last_available),
            last_available=available,
            up_runs=seen.up_runs + (ended if seen.last_available else ()),
            down_runs=seen.down_runs + (() if seen.last_available else ended),
            age_hours=seen.age_hours + hours if same else hours,
        )
        return AvailabilityHistory({**self.zones, zone: updated})

    def availability(self, zone: str) -> float:
        """Estimated fraction of time spot is obtainable in ``zone``."""
        seen = self.zones.get(zone, ZoneHistory())
        return availability_estimate(seen.available_hours, seen.observed_hours)

    def mean_window_hours(self, zone: str) -> float:
        """Estimated length of a spot window (time from getting spot to losing it)."""
        seen = self.zones.get(zone, ZoneHistory())
        return window_estimate(seen.available_hours, seen.windows)


def history_of(observations: Iterable[tuple[str, bool, float]]) -> AvailabilityHistory:
    """The history after ``observe`` of each ``(zone, available, hours)`` in turn, built in
    one pass (folding thousands of attempts through ``observe`` copies every run so far)."""
    state: dict[str, list[Any]] = {}
    for zone, available, hours in observations:
        seen = state.get(zone)
        if seen is None:
            seen = state[zone] = [0.0, 0.0, 0, False, [], [], 0.0]
        observed, up, windows, last, up_runs, down_runs, age = seen
        same = available == last
        if not same and age > 0:
            (up_runs if last else down_runs).append(age)
        seen[0] = observed + hours
        seen[1] = up + (hours if available else 0.0)
        seen[2] = windows + int(available and not last)
        seen[3] = available
        seen[6] = age + hours if same else hours
    return AvailabilityHistory(
        {
            zone: ZoneHistory(
                observed_hours=o,
                available_hours=a,
                windows=w,
                last_available=last,
                up_runs=tuple(ups),
                down_runs=tuple(downs),
                age_hours=age,
            )
            for zone, (o, a, w, last, ups, downs, age) in state.items()
        }
    )


def availability_estimate(available_hours: _Hours, observed_hours: _Hours) -> _Hours:
    """Shrunk towards the prior when little has been seen (works on arrays too)."""
    return (available_hours + PRIOR_AVAILABILITY * PRIOR_HOURS) / (observed_hours + PRIOR_HOURS)


def window_estimate(available_hours: _Hours, windows: _Hours) -> _Hours:
    """Mean available-window length with one prior window (works on arrays too)."""
    return (available_hours + PRIOR_WINDOW_HOURS) / (windows + 1.0)


@dataclass(frozen=True)
class PolicyState:
    """What the broker knows at one decision point (fields: see the module docstring)."""

    hours_to_deadline: float
    hours_total: float
    work_left_hours: float
    work_total_hours: float
    restart_hours: float
    tick_hours: float
    instance: Instance = Instance.NONE
    zone: str | None = None
    restart_left_hours: float = 0.0
    unsaved_hours: float = 0.0
    zones: tuple[str, ...] = ()
    spot_obtainable: tuple[bool, ...] = ()
    spot_price: float = 1.0
    on_demand_price: float = 3.0
    spent: float = 0.0
    reserved: float = math.inf
    reserve_limit: float | None = None
    on_demand_cost: float | None = None
    history: AvailabilityHistory = field(default_factory=AvailabilityHistory)
    plan: SpotPlan | None = None
    plan_row: int = 0

    @property
    def slack_hours(self) -> float:
        """Time to spare: what is left once the work and the pending overhead are done."""
        return self.hours_to_deadline - self.work_left_hours - self.restart_left_hours

    def with_(self, **changes: object) -> PolicyState:
        return replace(self, **changes)  # type: ignore[arg-type]


Policy = Callable[[PolicyState], Decision]
HOLD_AHEAD_HOURS = 1.0  # spot hours a hold takes beyond the net's need
STOP = Decision(Action.STOP)
CONTINUE = Decision(Action.CONTINUE)
ON_DEMAND = Decision(Action.ON_DEMAND)
WAIT = Decision(Action.WAIT)


def _first_spot_zone(state: PolicyState) -> str | None:
    for zone, obtainable in zip(state.zones, state.spot_obtainable, strict=True):
        if obtainable:
            return zone
    return None


def _spot_is_safe(state: PolicyState) -> bool:
    """A spot start may be preempted right after its overhead: room for one more restart."""
    return state.slack_hours >= 2 * state.restart_hours - EPS


def _cannot_wait(state: PolicyState) -> bool:
    """After one more tick without progress, spot would no longer be safe (Safety Net Rule)."""
    return state.slack_hours - state.tick_hours < 2 * state.restart_hours - EPS


def _last_moment(state: PolicyState) -> bool:
    """After one more tick without progress, an on-demand start could no longer finish."""
    return state.slack_hours - state.tick_hours < state.restart_hours - EPS


def net_need(state: PolicyState, decision: Decision) -> float | None:
    """What the budget net needs held for ``decision``: spent, a tick of what it holds (spot,
    or nothing) and on-demand to the end from a tick on (``on_demand_cost``); None for a
    decision that holds on-demand (or stops), which the net lets pass."""
    kept = {Action.SPOT: Instance.SPOT, Action.WAIT: Instance.NONE, Action.CONTINUE: state.instance}
    held = kept.get(decision.action, Instance.ON_DEMAND)  # STOP and ON_DEMAND pass
    if held is Instance.ON_DEMAND:
        return None
    tick = state.tick_hours
    finish = state.on_demand_cost
    if finish is None:
        finish = state.on_demand_price * (state.work_left_hours + state.restart_hours + tick)
    price = state.spot_price if held is Instance.SPOT else 0.0
    return state.spent + price * tick + finish


def budget_net(state: PolicyState, decision: Decision) -> Decision:
    """``decision``, unless it holds spot (or nothing) for a tick after which the reservation
    could no longer pay for on-demand to the end (``net_need``): then ``decision`` asking to
    hold that and ``HOLD_AHEAD_HOURS`` of spot more (``Decision.hold``) when
    ``reserve_limit`` allows it, else on-demand, started or kept. With it, spend never passes
    what is held (proof: ``broker.core.reservation``)."""
    need = net_need(state, decision)
    if need is None or need <= state.reserved:
        return decision
    limit = state.reserve_limit
    if limit is not None and need <= limit:
        # spend already sunk is no reason to leave spot: hold more, an hour ahead, so a job
        # that has not checkpointed yet does not come back for it at every tick
        on_spot = decision.action == Action.SPOT or (
            decision.action == Action.CONTINUE and state.instance is Instance.SPOT
        )
        ahead = state.spot_price * HOLD_AHEAD_HOURS if on_spot else 0.0
        return replace(decision, hold=min(limit, need + ahead))
    return CONTINUE if state.instance is Instance.ON_DEMAND else ON_DEMAND


def _netted(rule: Policy) -> Policy:
    """``rule`` under the budget net."""

    @wraps(rule)
    def netted(state: PolicyState) -> Decision:
        return budget_net(state, rule(state))

    return netted


def on_demand(state: PolicyState) -> Decision:
    """On-demand from start to finish."""
    if state.work_left_hours <= EPS:
        return STOP
    return CONTINUE if state.instance is Instance.ON_DEMAND else ON_DEMAND


@_netted
def greedy(state: PolicyState) -> Decision:
    """Spot whenever obtainable; on-demand to the end once waiting longer would be unsafe."""
    if state.work_left_hours <= EPS:
        return STOP
    if state.instance is not Instance.NONE:
        return CONTINUE
    zone = _first_spot_zone(state)
    if zone is not None and _spot_is_safe(state):
        return Decision(Action.SPOT, zone)
    return ON_DEMAND if _cannot_wait(state) else CONTINUE


@_netted
def uniform_progress(state: PolicyState) -> Decision:
    """Wu et al. (NSDI 2024): keep progress on the line t * C0 / R0, hysteresis on on-demand.

    Rules: spot whenever obtainable, stay on it until preempted; idle and behind the line
    -> on-demand; on-demand is left only for spot, once progress >= ep(t + 2d) (hysteresis);
    Safety Net Rule on top. (The paper's state diagram has no on-demand -> idle edge.)
    """
    if state.work_left_hours <= EPS:
        return STOP
    if state.instance is Instance.SPOT:
        return CONTINUE
    rate = state.work_total_hours / state.hours_total if state.hours_total > 0 else math.inf
    elapsed = state.hours_total - state.hours_to_deadline
    done = state.work_total_hours - state.work_left_hours
    zone = _first_spot_zone(state)
    if state.instance is Instance.ON_DEMAND:
        if _cannot_wait(state) or done < rate * (elapsed + 2 * state.restart_hours) - EPS:
            return CONTINUE
        return CONTINUE if zone is None else Decision(Action.SPOT, zone)
    if zone is not None and _spot_is_safe(state):
        return Decision(Action.SPOT, zone)
    if _cannot_wait(state) or done < rate * elapsed - EPS:
        return ON_DEMAND
    return CONTINUE


def _best_spot_zone(state: PolicyState) -> str | None:
    """The obtainable zone whose spot windows have lasted longest (first on ties)."""
    best, best_window = None, -1.0
    for zone, obtainable in zip(state.zones, state.spot_obtainable, strict=True):
        window = state.history.mean_window_hours(zone)
        if obtainable and window > best_window:
            best, best_window = zone, window
    return best


def spot_pays(
    spot_price: float | np.ndarray,
    on_demand_price: float | np.ndarray,
    window_hours: float | np.ndarray,
    work_left_hours: float | np.ndarray,
    restart_hours: float | np.ndarray,
    unsaved_hours: float | np.ndarray,
) -> np.ndarray:
    """Whether leaving on-demand for spot pays for the work it loses (works on arrays too).

    The plan already weighs the move's restart against what spot saves; it cannot know the
    work done since the latest checkpoint, which the move throws away. Over the spot window
    the zone's history expects (``window_hours``, no more than the work left, less the
    restart and the lost work), the saving must cover ``SWITCH_MARGIN`` times the cost of
    doing that work again. Without lost work (the simulator's case) it always pays.
    """
    working = np.minimum(window_hours, work_left_hours) - restart_hours - unsaved_hours
    saving = (on_demand_price - spot_price) * np.maximum(working, 0.0)
    return np.asarray(saving >= SWITCH_MARGIN * spot_price * unsaved_hours)


def spot_now(obtainable: np.ndarray, age_hours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spot in any of the zones (Z, ...): obtainable or not, and for how long so far.

    Up: the oldest window among the zones that have one; down: the youngest outage (the time
    since any zone last had spot). Works on arrays.
    """
    # a numpy bool when ``obtainable`` is 1-D (the scalar policy): it acts as a 0-d array
    up = cast(np.ndarray, obtainable.any(axis=0))
    up_age = np.where(obtainable, age_hours, 0.0).max(axis=0)
    down_age = np.where(obtainable, np.inf, age_hours).min(axis=0)
    return up, np.where(up, up_age, down_age)


@_netted
def broker(state: PolicyState) -> Decision:
    """Ours: hold what the expected-cost plan (``broker.core.spot_mdp``) says for this state.

    The plan is solved on a semi-Markov model of spot availability fitted to the history
    (``state.plan``, or solved here from ``state.history`` when none is given); it weighs
    what a window of this age will likely still give against the restarts it costs, and
    keeps every state able to finish on on-demand. A last net stays on top (the plan's
    steps round the job's times, and live ticks are uneven): a job whose waste is past the
    plan's slack, or that one more idle tick would leave no time for an on-demand start,
    neither drops its instance nor stays idle. Leaving on-demand for spot must also pay,
    with a margin, for the work since the checkpoint it throws away (``spot_pays``; the
    plan weighs the restart itself, which keeps a job on flapping spot from switching back
    and forth: ``tests/core/test_ping_pong.py``).
    (The Safety Net Rule's margin of two restarts, which greedy and Uniform Progress need,
    only costs a plan that already weighs the risk of losing spot: measured in
    ``bench/policies.py``.) The budget net
    (``budget_net``), as on greedy and Uniform Progress, keeps spend within the reservation.
    """
    if state.work_left_hours <= EPS:
        return STOP
    if state.instance is not Instance.NONE and state.restart_left_hours > EPS:
        return CONTINUE  # a start under way is paid for: see it through
    plan, row = (state.plan, state.plan_row) if state.plan else (plan_for(state), 0)
    seen = [state.history.zones.get(z, ZoneHistory()) for z in state.zones]
    obtainable = np.array(state.spot_obtainable, bool)
    # an age counts only for the state it was seen in (live, a zone's news may be stale)
    ages = [
        h.age_hours if h.last_available == o else 0.0 for h, o in zip(seen, obtainable, strict=True)
    ]
    up, age = spot_now(obtainable, np.array(ages))
    want = int(
        plan.lookup(
            np.array(row),
            np.array(state.hours_total - state.hours_to_deadline),
            np.array(state.work_total_hours - state.work_left_hours),
            np.array(int(state.instance)),
            chain_state(up, age, plan.step_hours, plan.edges),
        )
    )
    zone = _best_spot_zone(state)
    spot_ok = zone is not None and _spot_is_safe(state)
    must = want < 0 or _last_moment(state)
    if state.instance is Instance.SPOT:
        if want == Instance.ON_DEMAND:
            return ON_DEMAND
        return WAIT if want == Instance.NONE and not must else CONTINUE
    if state.instance is Instance.ON_DEMAND:
        if must:
            return CONTINUE
        if want == Instance.SPOT and spot_ok and _move_pays(state, zone):
            return Decision(Action.SPOT, zone)
        return WAIT if want == Instance.NONE else CONTINUE
    if want == Instance.SPOT and spot_ok:
        return Decision(Action.SPOT, zone)
    return ON_DEMAND if must or want == Instance.ON_DEMAND else CONTINUE


def _move_pays(state: PolicyState, zone: str | None) -> bool:
    """``spot_pays`` for leaving on-demand for spot in ``zone``."""
    return bool(
        spot_pays(
            state.spot_price,
            state.on_demand_price,
            state.history.mean_window_hours(zone or ""),
            state.work_left_hours,
            state.restart_hours,
            state.unsaved_hours,
        )
    )


def plan_for(state: PolicyState) -> SpotPlan:
    """The job's plan on a chain fitted to the windows and outages seen in its zones, with
    those seen in every zone of the history as the prior.

    Plans are shared: a job's plan depends on it only through its steps to the deadline,
    slack and restart in whole steps and the ratio of its spot to its on-demand price (a plan
    is the cheapest choice in each state, the same for prices scaled alike, and the same for
    every job at the same steps and slack left: ``spot_mdp.job_plan``). One solve on a
    slightly larger deadline and slack (``spot_mdp.shared_steps``) serves every job alike."""
    seen = [state.history.zones.get(z, ZoneHistory()) for z in state.zones]
    fleet = state.history.zones.values()
    step = plan_step_hours(state.tick_hours, state.hours_total)
    work, deadline, restart = plan_steps(
        step, state.work_total_hours, state.hours_total, state.restart_hours
    )
    shared_deadline, shared_slack = shared_steps(work, deadline)
    key = (
        tuple(sorted(r for h in seen for r in h.up_runs)),
        tuple(sorted(r for h in seen for r in h.down_runs)),
        tuple(sorted(r for h in fleet for r in h.up_runs)),
        tuple(sorted(r for h in fleet for r in h.down_runs)),
        step,
        shared_deadline - shared_slack,
        shared_deadline,
        restart,
        price_ratio(state.spot_price, state.on_demand_price),
    )
    return job_plan(PLANS.get(key, lambda: _solve(*key)), work, deadline)


# Every shared plan, kept while memory allows: each live job's is asked on every tick.
PLANS = PlanCache()


def _solve(
    up_runs: tuple[float, ...],
    down_runs: tuple[float, ...],
    fleet_up_runs: tuple[float, ...],
    fleet_down_runs: tuple[float, ...],
    step: float,
    work: int,
    deadline: int,
    restart: int,
    price_ratio: float,
) -> SpotPlan:
    chain = fit_chain(up_runs, down_runs, step, fleet=(fleet_up_runs, fleet_down_runs))
    return solve([chain], work, deadline, restart, price_ratio, 1.0)


POLICIES: dict[str, Policy] = {
    "on_demand": on_demand,
    "greedy": greedy,
    "uniform_progress": uniform_progress,
    "broker": broker,
}


def decide(state: PolicyState) -> Decision:
    """The policy the live broker runs (``broker``); the simulator measures the same one."""
    return broker(state)
