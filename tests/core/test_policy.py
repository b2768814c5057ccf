"""The policies' rules: hand-checked decisions, and the batched rules agree with the scalar."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from broker.core.policy import (
    POLICIES,
    Action,
    AvailabilityHistory,
    Decision,
    Instance,
    PolicyState,
)
from broker.core.policy_vectorized import BATCH_POLICIES, BatchState
from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import solve

ZONES = ("us-east-1a", "us-east-1c", "us-east-1d")


def state(**changes: object) -> PolicyState:
    base = PolicyState(
        hours_to_deadline=52.0,
        hours_total=52.0,
        work_left_hours=48.0,
        work_total_hours=48.0,
        restart_hours=0.2,
        tick_hours=0.1,
        zones=ZONES[:1],
        spot_obtainable=(False,),
        spot_price=0.92,
        on_demand_price=3.06,
    )
    return base.with_(**changes)


def test_every_policy_stops_when_the_work_is_done() -> None:
    for decide in POLICIES.values():
        assert decide(state(work_left_hours=0.0)).action is Action.STOP


def test_greedy_waits_for_spot_while_there_is_slack_and_takes_on_demand_when_it_must() -> None:
    assert POLICIES["greedy"](state()).action is Action.CONTINUE
    # slack 0.45 h: after one more 0.1 h tick it would be below 2 x 0.2 h
    tight = state(hours_to_deadline=10.45, work_left_hours=10.0)
    assert POLICIES["greedy"](tight).action is Action.ON_DEMAND
    spot = state(spot_obtainable=(True,))
    assert POLICIES["greedy"](spot) == Decision(Action.SPOT, ZONES[0])


def test_uniform_progress_catches_up_on_demand_when_behind_the_line() -> None:
    # 26 h elapsed of 52, 20 h done of 48: behind 24 h expected
    behind = state(hours_to_deadline=26.0, work_left_hours=28.0)
    assert POLICIES["uniform_progress"](behind).action is Action.ON_DEMAND
    ahead = state(hours_to_deadline=26.0, work_left_hours=20.0)
    assert POLICIES["uniform_progress"](ahead).action is Action.CONTINUE


def test_uniform_progress_leaves_on_demand_for_spot_only_past_the_hysteresis() -> None:
    # expected progress at t + 2d = (26 + 0.4) x 48 / 52 = 24.37 h
    on_od = dict(instance=Instance.ON_DEMAND, spot_obtainable=(True,), hours_to_deadline=26.0)
    assert POLICIES["uniform_progress"](state(**on_od, work_left_hours=23.7)).action is (
        Action.CONTINUE
    )
    moved = POLICIES["uniform_progress"](state(**on_od, work_left_hours=23.6))
    assert moved == Decision(Action.SPOT, ZONES[0])


def test_broker_picks_the_zone_whose_spot_windows_last_longest() -> None:
    history = AvailabilityHistory()
    for _ in range(10):  # 1c: ten one-hour windows; 1d: one ten-hour window
        history = history.observe("us-east-1c", True, 1.0).observe("us-east-1c", False, 1.0)
    history = history.observe("us-east-1d", True, 10.0).observe("us-east-1d", False, 10.0)
    s = state(zones=ZONES, spot_obtainable=(False, True, True), history=history)
    assert POLICIES["broker"](s) == Decision(Action.SPOT, "us-east-1d")
    assert history.zones["us-east-1c"].windows == 10
    assert history.availability("us-east-1d") == pytest.approx((10 + 12) / (20 + 24))


def history_of(window: float, outage: float, down_for: float, n: int = 20) -> AvailabilityHistory:
    """n windows and outages of these lengths, then a window and an outage ``down_for`` old."""
    history = AvailabilityHistory()
    for _ in range(n + 1):
        history = history.observe(ZONES[0], True, window).observe(ZONES[0], False, outage)
    return history.observe(ZONES[0], True, window).observe(ZONES[0], False, down_for)


def test_history_keeps_the_lengths_of_windows_and_outages_and_the_current_age() -> None:
    history = history_of(6.0, 0.3, 0.1, n=2)
    seen = history.zones[ZONES[0]]
    assert seen.up_runs == (6.0, 6.0, 6.0, 6.0)
    assert seen.down_runs == (0.3, 0.3, 0.3)
    assert (seen.last_available, seen.age_hours) == (False, 0.1)
    assert history.observe(ZONES[0], False, 0.2).zones[ZONES[0]].age_hours == pytest.approx(0.3)


def test_broker_waits_out_outages_its_history_says_are_short_and_not_long_ones() -> None:
    # 40 h of work in 52 h, 1 h gone: after 6 h windows and 0.3 h outages spot is soon back,
    # so the broker waits where Uniform Progress, behind its line, pays for on-demand
    short = state(
        hours_to_deadline=51.0,
        work_left_hours=40.0,
        work_total_hours=40.0,
        history=history_of(6.0, 0.3, 0.1),
    )
    assert POLICIES["uniform_progress"](short).action is Action.ON_DEMAND
    assert POLICIES["broker"](short).action is Action.CONTINUE
    # after 1 h windows and 8 h outages, waiting would spend the slack on nothing
    long = state(hours_to_deadline=52.0, history=history_of(1.0, 8.0, 0.5))
    assert POLICIES["greedy"](long).action is Action.CONTINUE
    assert POLICIES["broker"](long).action is Action.ON_DEMAND
    # 0.5 h of slack still covers a tick, a spot start and the on-demand start after it
    # (0.2 h each): the plan waits on ...
    assert POLICIES["broker"](short.with_(hours_to_deadline=40.5)).action is Action.CONTINUE
    # ... with less, a spot start would leave no room to finish on on-demand: waiting buys
    # nothing, so it starts on-demand now rather than idle to the last moment (IDLE_COST)
    assert POLICIES["broker"](short.with_(hours_to_deadline=40.45)).action is Action.ON_DEMAND
    assert POLICIES["broker"](short.with_(hours_to_deadline=40.25)).action is Action.ON_DEMAND


def test_a_plan_does_not_change_with_float_noise_of_the_size_blas_kernels_differ_by() -> None:
    # costs that tie exactly (e.g. a job with spot and on-demand at one price) must break the
    # same way whatever the last bits of a matrix product are
    history = history_of(6.0, 0.3, 0.1).zones[ZONES[0]]
    chain = fit_chain(history.up_runs, history.down_runs, 0.1)
    rng = np.random.default_rng(7)
    noisy = dataclasses.replace(
        chain, matrix=chain.matrix * (1 + 1e-14 * rng.standard_normal(chain.matrix.shape))
    )
    for od_price in (0.92, 3.06):
        plans = [solve([c], 60, 90, 2, 0.92, od_price) for c in (chain, noisy)]
        assert np.array_equal(plans[0].want, plans[1].want)


def test_a_zone_seen_briefly_borrows_the_fleets_hazards_and_one_seen_long_keeps_its_own() -> None:
    def window_end_chance(chain, age_bucket: int) -> float:  # type: ignore[no-untyped-def]
        a = len(chain.edges)
        return float(chain.matrix[a + age_bucket, 0])

    fleet = ([8.0] * 200, [0.5] * 200)  # the fleet's windows last 8 h
    brief = fit_chain([0.3, 0.3], [0.5, 0.5], 0.1, fleet=fleet)
    alone = fit_chain([0.3, 0.3], [0.5, 0.5], 0.1)
    # a window 3 h old: alone, two 0.3 h windows say it ends soon; the fleet says not
    old = 7  # ages 2.7-4 h in 0.1 h steps
    assert window_end_chance(brief, old) < window_end_chance(alone, old) / 3
    long_seen = fit_chain([0.3] * 500, [0.5] * 500, 0.1, fleet=fleet)
    young = 2  # ages 0.3-0.4 h, where all its 500 windows of 0.3 h ended: its own data wins
    assert window_end_chance(long_seen, young) > 0.5


def random_batch(rng: np.random.Generator, n: int) -> BatchState:
    zones = ZONES[: int(rng.integers(1, 4))]
    z = len(zones)
    tick = rng.choice([0.05, 0.1, 0.25], n)
    restart = rng.choice([0.0, 0.1, 0.2, 0.5], n)
    total = rng.uniform(1, 80, n)
    work_total = total * rng.uniform(0.3, 1.05, n)
    to_deadline = total * rng.uniform(0, 1, n)
    work_left = np.minimum(work_total, to_deadline * rng.uniform(0, 1.2, n))
    work_left[rng.random(n) < 0.05] = 0.0
    instance = rng.integers(0, 3, n)
    zone = np.where(instance == Instance.SPOT, rng.integers(0, z, n), -1)
    obtainable = rng.random((z, n)) < 0.5
    obtainable[zone[zone >= 0], np.flatnonzero(zone >= 0)] = True
    observed = rng.uniform(0, 200, (z, n))
    chains = [
        fit_chain(rng.exponential(window, 30), rng.exponential(1.0, 30), 0.1)
        for window in (0.5, 2.0, 8.0)
    ]
    plans = (solve(chains, 300, 400, 3, 0.92, 3.06), solve(chains[:2], 200, 220, 1, 0.5, 3.06))
    plan_of = rng.integers(0, 2, n)
    spent = rng.uniform(0, 50, n)
    # around what finishing on on-demand needs, so the budget net binds on some states
    reserved = spent + 3.06 * (work_left + restart + tick) * rng.uniform(0.9, 1.2, n)
    reserved[rng.random(n) < 0.2] = np.inf
    return BatchState(
        hours_to_deadline=to_deadline,
        hours_total=total,
        work_left_hours=work_left,
        work_total_hours=work_total,
        restart_hours=restart,
        tick_hours=tick,
        instance=instance,
        zone=zone,
        restart_left_hours=np.where(instance > 0, restart * rng.integers(0, 2, n), 0.0),
        spot_obtainable=obtainable,
        spot_price=float(rng.uniform(0.2, 1.0)),
        on_demand_price=3.06,
        observed_hours=observed,
        available_hours=observed * rng.uniform(0, 1, (z, n)),
        windows=rng.integers(0, 30, (z, n)).astype(float),
        last_available=rng.random((z, n)) < 0.5,
        zones=zones,
        age_hours=rng.exponential(2.0, (z, n)),
        plans=plans,
        plan_of=plan_of,
        plan_row=rng.integers(0, 2, n),
        spent=spent,
        reserved=reserved,
        unsaved_hours=rng.choice([0.0, 0.0, 0.5, 2.0], n),
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_batched_rule_agrees_with_the_scalar_rule_on_random_states(name: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        batch = random_batch(rng, 100)
        actions, zones = BATCH_POLICIES[name](batch)
        for b in range(100):
            expected = POLICIES[name](batch.row(b))
            got_zone = batch.zones[zones[b]] if zones[b] >= 0 else None
            assert (Action(int(actions[b])), got_zone) == (expected.action, expected.zone), b
