"""The cheapest way to finish a job by its deadline, in expectation over a ``SpotChain``.

A finite-horizon Markov decision process on the simulator's model (``broker.sim.simulator``), in
steps of the chain: the state is (step, waste, what runs, spot's chain state), where waste =
steps elapsed - steps of work done, bounded by the slack, so every state it keeps can still
finish on on-demand by the deadline; the choice each step is to run nothing, spot (when
obtainable) or on-demand. A start runs ``restart`` steps without progress, paid at the new
instance's price; a spot instance is lost the first step spot is gone. Backward induction
gives, for every state, the instance to hold: ``SpotPlan.want``.

Solved for B chains at once (one per zone history, e.g. one per day of a trace), so the
per-step numpy work is shared. Pure: arrays in, arrays out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from broker.core.spot_chain import SpotChain

MIN_STEP_HOURS = 0.1  # finer buys little: restarts and checkpoints take minutes
MAX_STEPS = 1000  # a plan's steps to the deadline (and so its memory) stay bounded
UNREACHABLE = 1e12  # cost of a state that cannot finish by the deadline (finite: 0 * it = 0)
NONE, SPOT, ON_DEMAND = 0, 1, 2  # ``broker.core.policy.Instance`` values


# A step idle costs the plan this fraction of a spot step (never billed). Were waiting free,
# a sliver of risk saved (a fresh window's lower hazard than an old one's, in a chain whose
# hazard rises with age) would have a plan idle for hours, or drop on-demand to idle, while
# spot is to hand; the live broker launches a job with spot to hand, and a late start only
# spends slack a misfitted chain may need.
IDLE_COST = 0.01
SOLVER_VERSION = 2  # part of a plan's name (``plan_cache.key_digest``): older plans re-solve

TIE_TOLERANCE = 1e-9  # relative; far above BLAS rounding, far below any real cost difference


def _no_worse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a <= b up to float noise."""
    return a <= b + TIE_TOLERANCE * np.maximum(1.0, np.abs(b))


@dataclass(frozen=True)
class SpotPlan:
    """Per (step, chain, instance held, chain state, waste): the instance to hold (int8)."""

    step_hours: float
    work: int  # steps
    deadline: int  # steps
    restart: int  # steps
    edges: np.ndarray  # the chains' age buckets
    want: np.ndarray  # (deadline, B, 3, 2A, slack + 1), indexed by Instance value

    @property
    def slack(self) -> int:
        return self.deadline - self.work

    def lookup(
        self,
        row: np.ndarray,
        elapsed_hours: np.ndarray,
        done_hours: np.ndarray,
        instance: np.ndarray,
        state: np.ndarray,
    ) -> np.ndarray:
        """The instance to hold (Instance values) for jobs on chain ``row`` in chain ``state``.

        ``-1`` where the job has wasted more than the plan's slack (its rounding to steps
        left it no plan): the caller's safety net decides there.
        """
        elapsed = np.asarray(elapsed_hours)
        step = np.floor(elapsed / self.step_hours + 1e-9).astype(np.int64)
        # waste rounds up: the plan never thinks the job has more slack than it has
        waste = np.ceil((elapsed - done_hours) / self.step_hours - 1e-9).astype(np.int64)
        lost = (waste > self.slack) | (waste < 0)
        step = np.clip(step, 0, self.deadline - 1)
        waste = np.clip(waste, 0, self.slack)
        want = self.want[step, row, instance, state, waste]
        return np.where(lost, -1, want)


def plan_step_hours(tick_hours: float, hours_total: float) -> float:
    """A whole number of ticks, about ``MIN_STEP_HOURS``, at most ``MAX_STEPS`` to the deadline."""
    coarse = math.ceil(hours_total / (MAX_STEPS * tick_hours))
    ticks = max(1, round(MIN_STEP_HOURS / tick_hours), coarse)
    return ticks * tick_hours


def solve_hours(
    chains: list[SpotChain],
    work_hours: float,
    deadline_hours: float,
    restart_hours: float,
    spot_price: float,
    on_demand_price: float,
) -> SpotPlan:
    """``solve`` for a job in hours, rounded to the chains' steps so as never to flatter it,
    with prices as their ``price_ratio``.

    Work and restart round up, the deadline down; a job left no slack gets a plan that
    keeps it on on-demand throughout.
    """
    work, deadline, restart = plan_steps(
        chains[0].step_hours, work_hours, deadline_hours, restart_hours
    )
    return solve(chains, work, deadline, restart, price_ratio(spot_price, on_demand_price), 1.0)


PRICE_RATIO_DIGITS = 3  # a drift of a tenth of a percent in spot / on-demand re-plans


def price_ratio(spot_price: float, on_demand_price: float) -> float:
    """Spot over on-demand price, rounded: all a plan depends on of the prices (the plan is
    the cheapest choice in each state, the same for prices scaled alike), so jobs whose
    prices differ but not their ratio share one plan."""
    if on_demand_price <= 0:
        return spot_price
    return round(spot_price / on_demand_price, PRICE_RATIO_DIGITS)


def plan_steps(
    step_hours: float, work_hours: float, deadline_hours: float, restart_hours: float
) -> tuple[int, int, int]:
    """Work, deadline and restart in whole steps, as ``solve_hours`` rounds them: work and
    restart up, the deadline down (never before the work)."""
    work = max(math.ceil(work_hours / step_hours - 1e-9), 1)
    deadline = max(math.floor(deadline_hours / step_hours + 1e-9), work)
    restart = math.ceil(restart_hours / step_hours - 1e-9)
    return work, deadline, restart


def shared_steps(work: int, deadline: int) -> tuple[int, int]:
    """The deadline and slack (in steps) of the shared plan that holds a job's plan: each
    rounded up to a quarter of its leading power of two (at most a quarter more to solve),
    so jobs of nearby sizes share one solve (``job_plan``)."""

    def up(n: int) -> int:
        if n <= 4:
            return n
        grain = 1 << (n.bit_length() - 3)
        return -(-n // grain) * grain

    slack = up(deadline - work)
    return up(max(deadline, slack + 1)), slack


def job_plan(shared: SpotPlan, work: int, deadline: int) -> SpotPlan:
    """A job's plan read off a shared one (``shared_steps``): a view, no copy.

    A plan's choice depends only on the steps left to the deadline and the slack left (what
    the job can still waste), never on how long the job is: the job's step ``t`` with waste
    ``w`` is the shared plan's step ``t + (D - deadline)`` with waste ``w + (S - slack)``.
    """
    slack = deadline - work
    if work < 1 or slack < 0 or deadline > shared.deadline or slack > shared.slack:
        raise ValueError("the shared plan does not hold this job's")
    t0, w0 = shared.deadline - deadline, shared.slack - slack
    want = shared.want[t0:, ..., w0 : w0 + slack + 1]
    return SpotPlan(shared.step_hours, work, deadline, shared.restart, shared.edges, want)


def _power(matrix: np.ndarray, n: int) -> np.ndarray:
    """matrix^n for a stack, multiplied in order (``matrix_power``'s squaring rounds otherwise
    and can flip a near-tie between two choices)."""
    out = np.broadcast_to(np.eye(matrix.shape[-1]), matrix.shape).copy()
    for _ in range(n):
        out = out @ matrix
    return out


def solve(
    chains: list[SpotChain],
    work: int,
    deadline: int,
    restart: int,
    spot_price: float,
    on_demand_price: float,
) -> SpotPlan:
    """Backward induction for a job of ``work`` steps due in ``deadline`` steps (prices per hour).

    Every chain must share one step and age buckets. ``restart`` >= 1 step.
    """
    step_hours = chains[0].step_hours
    edges = chains[0].edges
    a = len(edges)
    p = np.stack([c.matrix for c in chains])  # (B, X, X)
    b, x = p.shape[0], 2 * a
    slack = deadline - work
    q = max(restart, 1)
    if slack < 0 or work <= 0:
        raise ValueError("a plan needs work > 0 and a deadline past the work")
    width = slack + 1
    pad = width + q  # waste beyond the slack reads as unreachable
    spot, od = spot_price * step_hours, on_demand_price * step_hours
    up = p[:, a:, a:]  # (B, A, A): spot stays obtainable
    lost = p[:, a:, 0]  # (B, A): spot gone, outage of age 1
    p_q = _power(p, q)
    first_loss = []  # P(spot first gone j steps after a spot start), j = 1..q
    survive = np.broadcast_to(np.eye(a), up.shape).copy()
    for _ in range(q):
        first_loss.append(np.einsum("bij,bj->bi", survive, lost))
        survive = survive @ up
    waste = np.arange(pad)

    def settled(t: int) -> np.ndarray:
        """Values of a step before any choice: 0 once the work is done, else unknown."""
        return np.where((t - waste >= work) & (waste <= slack), 0.0, UNREACHABLE)

    def ahead(values: np.ndarray, k: int) -> np.ndarray:
        """values[..., w + k]: k more steps of waste."""
        out = np.full(values.shape, UNREACHABLE)
        out[..., : pad - k] = values[..., k:]
        return out

    future: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for t in range(deadline, deadline + q + 1):
        end = np.broadcast_to(settled(t), (b, x, pad))
        future[t] = (end, end, end[:, a:])
    want = np.zeros((deadline, b, 3, x, width), np.int8)
    for t in range(deadline - 1, -1, -1):
        idle1, od1, spot1 = future[t + 1]
        idle_q, od_q, spot_q = future[t + q]
        wait = IDLE_COST * spot + p @ ahead(idle1, 1)
        start_od = q * od + p_q @ ahead(od_q, q)
        start_spot = np.full((b, x, pad), UNREACHABLE)
        value = survive @ (q * spot + ahead(spot_q, q))
        for j in range(1, q + 1):
            value += first_loss[j - 1][:, :, None] * (j * spot + ahead(future[t + j][0][:, :1], j))
        start_spot[:, a:] = value
        keep_od = od + p @ od1
        keep_spot = spot + up @ spot1 + lost[:, :, None] * idle1[:, None, 0]
        done = settled(t) == 0.0
        options = {
            NONE: ((wait, NONE), (start_od, ON_DEMAND), (start_spot, SPOT)),
            ON_DEMAND: ((keep_od, ON_DEMAND), (wait, NONE), (start_spot, SPOT)),
            SPOT: ((keep_spot, SPOT), (start_od[:, a:], ON_DEMAND), (wait[:, a:], NONE)),
        }
        values = {}
        for held, ((v0, k0), (v1, k1), (v2, k2)) in options.items():
            # ties (within float noise, which varies with the BLAS kernel) keep what is held,
            # then the earlier choice, so a plan does not depend on the machine
            first = _no_worse(v0, np.minimum(v1, v2))
            best = np.minimum(np.minimum(v0, np.minimum(v1, v2)), UNREACHABLE)
            kinds = np.where(first, k0, np.where(_no_worse(v1, v2), k1, k2)).astype(np.int8)
            best[..., done] = 0.0
            best[..., width:] = UNREACHABLE
            if held == SPOT:
                want[t, :, held, a:] = kinds[..., :width]
            else:
                want[t, :, held] = kinds[..., :width]
            values[held] = best
        future[t] = (values[NONE], values[ON_DEMAND], values[SPOT])
        future.pop(t + q + 1, None)
    return SpotPlan(step_hours, work, deadline, q, edges, want)
