"""The policies' rules: hand-checked decisions, and the batched rules agree with the scalar."""

from __future__ import annotations

import numpy as np
import pytest

from broker.policy import (
    POLICIES,
    Action,
    AvailabilityHistory,
    Decision,
    Instance,
    PolicyState,
)
from broker.policy_batch import BATCH_POLICIES, BatchState

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


def test_broker_tracks_uniform_progress_only_when_loose_and_restarts_are_cheap() -> None:
    history = AvailabilityHistory()
    for _ in range(10):  # ten one-hour windows: mean window (10 + 2) / 11 = 1.09 h
        history = history.observe(ZONES[0], True, 1.0).observe(ZONES[0], False, 1.0)
    # 48 h of work in 72 h (loose), 40 h elapsed, 24 h done: behind the line (26.7 h)
    behind = state(hours_total=72.0, hours_to_deadline=32.0, work_left_hours=24.0, history=history)
    assert POLICIES["uniform_progress"](behind).action is Action.ON_DEMAND
    assert POLICIES["broker"](behind).action is Action.ON_DEMAND  # 0.2 h <= 0.25 x 1.09 h
    costly = behind.with_(restart_hours=0.5)  # restarts too dear to chase the line: wait
    assert POLICIES["broker"](costly).action is Action.CONTINUE
    # tight: its own rule, 24 h left > the spot forecast 0.5 x 31.9 h, and ahead of the
    # line (20 h elapsed of 52) where Uniform Progress would wait
    tight = behind.with_(hours_total=52.0)
    assert POLICIES["uniform_progress"](tight).action is Action.CONTINUE
    assert POLICIES["broker"](tight).action is Action.ON_DEMAND


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
