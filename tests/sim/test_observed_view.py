"""The observed view: the policy sees only the zones the job looks at (issue 22)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from broker.core.policy import MOVE_BACK_HOURS, REFUSED_HOURS, Instance
from broker.core.policy_vectorized import BATCH_POLICIES, BatchState
from broker.sim.scenario import Ticks, TraceJob
from broker.sim.simulator import _believed, simulate_runs

# 1 h ticks; 4 h of work in 8 h; 1 h restart; spot $1/h, on-demand $3/h
JOB = TraceJob(
    work_hours=4.0, deadline_hours=8.0, restart_hours=1.0, spot_price=1.0, on_demand_price=3.0
)
TICKS = Ticks.of(JOB, 3600.0)
LENGTH = 40


def run(matrix: np.ndarray, policy: str, view: str, **probes: float) -> tuple[float, bool]:
    """Cost and missed of one job started at tick 20 (20 ticks of history before it)."""
    result = simulate_runs(
        BATCH_POLICIES[policy],
        matrix,
        np.array([20]),
        [(TICKS, JOB)],
        ("a", "b"),
        view=view,
        **probes,  # type: ignore[arg-type]
    )[0]
    return float(result.cost[0]), bool(result.missed[0])


# zone a (the job's home) never has spot; zone b has it from the job's start on only,
# so no history shows it up: the job looks there only once its news of b is stale, or probes
B_HIDDEN = np.zeros((2, LENGTH), bool)
B_HIDDEN[1, 20:] = True


@pytest.mark.parametrize("policy", ["greedy", "uniform_progress"])
def test_a_zone_seen_without_spot_is_tried_anew_once_that_news_is_stale(policy: str) -> None:
    # full: spot in b at once, 1 h restart + 4 h work at $1, done at 5 h; observed: b was
    # last seen down, which holds for REFUSED_HOURS (one tick here), then it is tried: the
    # same $5, an hour later
    assert run(B_HIDDEN, policy, "full") == (pytest.approx(5.0), False)
    assert run(B_HIDDEN, policy, "observed") == (pytest.approx(5.0), False)
    if policy == "greedy":
        assert finish(B_HIDDEN, JOB, "full") == (pytest.approx(5.0), pytest.approx(5.0))
        assert finish(B_HIDDEN, JOB, "observed") == (pytest.approx(5.0), pytest.approx(6.0))


def test_news_of_no_spot_holds_refused_hours_or_move_back_hours_on_on_demand() -> None:
    last = np.array([[False, False, False, True]])
    since = np.array([[3, 4, 12, 0]])  # ticks since each was last seen, 0.25 h ticks
    waiting = np.full(4, int(Instance.NONE))
    on_demand = np.full(4, int(Instance.ON_DEMAND))
    assert REFUSED_HOURS == 1.0 and MOVE_BACK_HOURS == 3.0
    assert _believed(last, since, 0.25, waiting).tolist() == [[False, True, True, True]]
    assert _believed(last, since, 0.25, on_demand).tolist() == [[False, False, True, True]]


def test_a_probe_is_billed_and_shows_the_zone() -> None:
    # greedy, probing every tick for 0.1 h: the first tick it is idle (it only goes
    # on-demand when it cannot wait), probes b ($0.1), sees it up and launches there:
    # 1 h restart + 4 h work at $1
    cost, missed = run(B_HIDDEN, "greedy", "observed", probe_every=1, probe_hours=0.1)
    assert (cost, missed) == (pytest.approx(5.1), False)


def finish(matrix: np.ndarray, job: TraceJob, view: str) -> tuple[float, float]:
    """Greedy's cost and finish hours for ``job`` started at tick 20 on two zones."""
    result = simulate_runs(
        BATCH_POLICIES["greedy"],
        matrix,
        np.array([20]),
        [(Ticks.of(job, 3600.0), job)],
        ("a", "b"),
        view=view,
    )[0]
    assert not result.missed[0]
    return float(result.cost[0]), float(result.finish_hours[0])


def test_a_refused_launch_costs_the_tick_and_no_money() -> None:
    # b was up for all the history before the start and goes down at the start; a (home)
    # never has spot. 4 h of work by 6.5 h, 1 h restart: 2.5 h of slack, safe for spot but
    # too little to wait. Full view: nothing up, on-demand at 0 h, done at 5 h for $15.
    # Observed: greedy believes b, launches there and is refused (no instance, no money),
    # then on-demand at 1 h: done at 6 h, still $15.
    job = TraceJob(4.0, 6.5, 1.0, 1.0, 3.0, reserved=math.inf)  # no budget net
    matrix = np.zeros((2, LENGTH), bool)
    matrix[1, :20] = True
    assert finish(matrix, job, "full") == (pytest.approx(15.0), pytest.approx(5.0))
    assert finish(matrix, job, "observed") == (pytest.approx(15.0), pytest.approx(6.0))


def test_single_zone_is_as_before_by_hand() -> None:
    # one zone, spot down for the job's first 2 h then up: greedy waits (6 h of slack less
    # 2 h restart margin), launches at 2 h: 1 h restart + 4 h work at $1 = $5, both views
    matrix = np.zeros((1, LENGTH), bool)
    matrix[0, 22:] = True
    for view in ("full", "observed"):
        result = simulate_runs(
            BATCH_POLICIES["greedy"], matrix, np.array([20]), [(TICKS, JOB)], ("a",), view=view
        )[0]
        assert float(result.cost[0]) == pytest.approx(5.0)
        assert float(result.finish_hours[0]) == pytest.approx(7.0)


def test_on_demand_keeps_no_spot_request_open_in_its_home_zone() -> None:
    # one zone, down for the job's first 3 h, then up; 4 h of work in 8 h, 1 h restart.
    # Greedy waits while its slack allows (watching its home: a spot request open), then
    # runs on on-demand, where live no request is open: the observed view no longer sees
    # the zone come back at 3 h and shows the policy what it saw last; the full view does.
    matrix = np.zeros((1, LENGTH), bool)
    matrix[0, 23:] = True
    seen = {}
    for view in ("full", "observed"):
        probe = _Recorder()
        simulate_runs(probe, matrix, np.array([20]), [(TICKS, JOB)], ("a",), view=view)
        seen[view] = probe.obtainable
    assert seen["full"][:5] == [False, False, False, True, True]
    # waiting (0-1 h) it watches its home; on on-demand from 2 h it believes what it saw last
    assert seen["observed"][:5] == [False, False, False, False, False]


def test_a_given_history_replaces_the_traces_past() -> None:
    # the trace's past: 20 h seen, spot up; the given history: 5 h seen, spot down. Its first
    # decision has only its history (it has not asked for spot yet): the given one
    matrix = np.ones((1, LENGTH), bool)
    history = tuple(
        np.array([[v]]) for v in (5.0, 0.0, 0.0, False, 5.0)
    )  # observed, available, windows, last, age
    seen = {}
    for given in (None, history):
        probe = _Recorder()
        simulate_runs(
            probe, matrix, np.array([20]), [(TICKS, JOB)], ("a",), view="observed", history=given
        )
        seen[given is None] = (probe.obtainable[0], probe.observed[0])
    assert seen[True] == (True, 20.0)
    assert seen[False] == (False, 5.0)
    with pytest.raises(ValueError, match="five"):
        simulate_runs(
            BATCH_POLICIES["greedy"],
            matrix,
            np.array([20]),
            [(TICKS, JOB)],
            ("a",),
            history=history[:4],
        )


class _Recorder:
    """Greedy, recording what it was shown of zone 0 each tick."""

    def __init__(self) -> None:
        self.obtainable: list[bool] = []
        self.observed: list[float] = []

    def __call__(self, state: BatchState) -> tuple[np.ndarray, np.ndarray]:
        self.obtainable.append(bool(state.spot_obtainable[0, 0]))
        self.observed.append(float(state.observed_hours[0, 0]))
        return BATCH_POLICIES["greedy"](state)
