"""Trace-driven simulation of deadline jobs on spot availability traces, every start at once.

The model (Wu et al., NSDI 2024, section 3), on the ticks of the trace's ``gap_seconds``:
each tick, spot is obtainable or not in each zone; the job holds at most one instance (spot
in one zone, or on-demand, which is always obtainable), chosen at the start of each tick,
and pays its price for the time it holds it; every start or switch costs ``restart_hours``
with no progress; a spot instance is lost at the first tick its zone is unavailable. Time is
kept in parts of a tick (``scenario.Ticks``), exactly: a restart overhead that ends within a
tick leaves the rest of that tick to the work, and a job pays up to the moment its work is
done (a 0.2 h restart on 600 s ticks costs 0.2 h, as in the paper's simulator, not two whole
ticks). The deadline may fall within a tick, and what is done after it does not count. A job
starts at a trace offset and wraps around the end of the trace. The policy sees what the job
has spent and its reservation (``scenario.reserved``), as live, so its budget net works here
too.

Two views of spot availability (``view``). ``"full"``: every zone's availability reaches the
policy every tick, for free, and every zone's statistics advance every tick. ``"observed"``:
only what the live broker can see. A job observes, each tick, its *home* zone (the zone it
last held spot in; at the start its first zone) while it holds spot there (live, it
learns a loss) or holds nothing (it waits with a spot request open there, asked once a
tick from its first decision on, a refusal costing nothing: its first decision has only
its history), but not while it runs on on-demand, when live no request is open; and any
zone it launches spot into that tick (a refused launch: no instance, no money, the tick's
time lost; an instance already held is kept, as live the old one is stopped only once the
new one runs). A zone's statistics (observed and available hours, windows, last state,
age) advance only on the ticks it is observed, and the policy's ``spot_obtainable`` for a
zone is its last observed state there (at the start, the history's:
``broker.sim.history``, or what a live broker knew, ``history``), except that news of no
spot goes stale as live: a zone last seen without spot ``policy.REFUSED_HOURS`` ago
(``MOVE_BACK_HOURS`` for a job on on-demand) is believed to have it, so the policy may try
it anew. So a job on on-demand moves back to spot only by launching where it believes
spot is, as live; single-zone, the observed view differs from the full one only there.
Optional probes (every ``probe_every`` ticks while the job is not on spot): a
``probe_hours`` spot launch in the zone seen longest ago (not the home zone), billed at the
spot price when it gets an instance, reveals that zone for the tick.

The simulator asks the policy through the same rule the live broker runs (the batched form of
``broker.core.policy``), for all start offsets in lockstep. ``broker.sim.hindsight`` gives the
hindsight optimum on the same model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from broker.core.policy import MOVE_BACK_HOURS, REFUSED_HOURS, Action, Instance
from broker.core.policy_vectorized import BATCH_POLICIES, BatchPolicy, BatchState, broker_batch
from broker.core.spot_mdp import SpotPlan
from broker.sim.hindsight import optimal_costs
from broker.sim.history import prime_history, start_plans
from broker.sim.scenario import Ticks, TraceJob, job_windows, reserved, zone_matrix
from pricing.traces import Trace


@dataclass(frozen=True)
class SimResult:
    """Per start offset: cost ($), deadline missed, hours until the work was done."""

    cost: np.ndarray
    missed: np.ndarray
    finish_hours: np.ndarray


def simulate(
    policy: str | BatchPolicy,
    traces: Sequence[Trace],
    job: TraceJob,
    offsets: np.ndarray,
) -> SimResult:
    """Run ``policy`` on the zones ``traces`` from every start offset; see the module doc."""
    decide = BATCH_POLICIES[policy] if isinstance(policy, str) else policy
    matrix, gap = zone_matrix(traces)
    ticks = Ticks.of(job, gap)
    return simulate_ticks(decide, matrix, offsets, ticks, job, tuple(t.zone for t in traces))


def simulate_ticks(
    decide: BatchPolicy,
    matrix: np.ndarray,
    offsets: np.ndarray,
    ticks: Ticks,
    job: TraceJob,
    zones: tuple[str, ...],
    fleet: np.ndarray | None = None,
) -> SimResult:
    """The lockstep loop on a (Z, L) availability matrix, the job already in ticks."""
    return simulate_runs(decide, matrix, offsets, [(ticks, job)], zones, fleet=fleet)[0]


def simulate_runs(
    decide: BatchPolicy,
    matrix: np.ndarray,
    offsets: np.ndarray,
    runs: Sequence[tuple[Ticks, TraceJob]],
    zones: tuple[str, ...],
    plans: tuple[tuple[SpotPlan, ...], np.ndarray] | None = None,
    fleet: np.ndarray | None = None,
    view: str = "full",
    probe_every: int = 0,
    probe_hours: float = 0.0,
    history: tuple[np.ndarray, ...] | None = None,
) -> list[SimResult]:
    """Several jobs (same tick and prices) from every start offset, all in one lockstep loop.

    One result per run, in order. Batching the runs amortizes the per-tick numpy overhead,
    which dominates at a few hundred offsets. The ``broker`` policy's plans
    (``history.start_plans``, on ``fleet``'s history as the prior) are solved here unless
    given. ``view``, ``probe_every``, ``probe_hours``: see the module doc (probes only in
    the observed view; 0: none). ``history``: what each job knows of the zones at its start
    (observed hours, available hours, windows, last state, age in hours; each (Z, B x runs),
    runs one after the other, as ``prime_history`` gives), in place of the trace's past,
    e.g. what a live broker knew when it admitted the job.
    """
    if view not in ("full", "observed"):
        raise ValueError(f"unknown view {view!r}")
    if (
        len({t.hours for t, _ in runs}) != 1
        or len({(j.spot_price, j.on_demand_price) for _, j in runs}) != 1
    ):
        raise ValueError("runs simulated together need the same tick and prices")
    first, job = runs[0]
    b = len(offsets)
    n = b * len(runs)
    dt = first.hours
    # per job, in parts of a tick (runs may split ticks differently)
    parts, deadline, work_total, restart = (
        np.repeat(np.array(values, np.int64), b)
        for values in zip(*((t.parts, t.deadline, t.work, t.restart) for t, _ in runs), strict=True)
    )
    cap = np.repeat(np.array([reserved(j, t) for t, j in runs]), b)
    unit = dt / parts  # hours in a part
    horizon = max(t.span for t, _ in runs)
    window = np.tile(job_windows(matrix, offsets, max(horizon, 1)), (1, len(runs), 1))
    n_zones = matrix.shape[0]
    if history is not None:
        if len(history) != 5 or any(np.shape(h) != (n_zones, n) for h in history):
            raise ValueError(f"history needs five ({n_zones}, {n}) arrays")
        observed, avail_hours, windows, last, age = (
            np.asarray(h, dtype)
            for h, dtype in zip(history, (float, float, float, bool, float), strict=True)
        )
    else:  # each run's history stops short of what its own jobs wrap onto
        observed, avail_hours, windows, last, age = (
            np.concatenate(per_run, axis=1)
            for per_run in zip(
                *(prime_history(matrix, offsets, dt, t.span) for t, _ in runs), strict=True
            )
        )
    full = view == "full"
    rows = np.arange(n)
    home = np.zeros(n, np.int64)  # the zone the job last held spot in
    seen_tick = np.zeros((n_zones, n), np.int64)  # tick each zone was last observed
    probe_cost = np.zeros(n)
    plan_of = plan_row = None
    if plans is None and decide is broker_batch:  # it plans each job on the history before it
        plans = start_plans(matrix, offsets, dt, runs, fleet)
    if plans is not None:
        plan_of, plan_row = np.repeat(np.arange(len(runs)), b), np.tile(plans[1], len(runs))
    instance = np.zeros(n, np.int8)
    zone = np.full(n, -1)
    overhead = np.zeros(n, np.int64)
    work_left = work_total.copy()
    held = np.zeros((2, n), np.int64)  # parts on spot, on on-demand
    finish = np.full(n, -1, np.int64)
    stopped = np.zeros(n, bool)
    hours_total, work_total_hours = deadline * unit, work_total * unit
    restart_hours, tick_hours = restart * unit, np.full(n, dt)
    for t in range(horizon):
        elapsed = t * parts
        expired = deadline <= elapsed  # past its deadline: frozen as it was
        if (stopped | expired).all():
            break
        live = ~stopped & ~expired
        now = window[:, :, t]
        if full:
            seen = np.ones((n_zones, n), bool)
        else:
            seen = np.zeros((n_zones, n), bool)
            # its home while it holds spot there, or waits for it with a spot request open
            # (from its first tick's ask on: at its start it knows only its history); on
            # on-demand it keeps no request open: it learns spot only by launching
            watched = (instance != Instance.ON_DEMAND) & (t > 0)
            seen[home[watched], rows[watched]] = True
            if probe_every > 0 and t % probe_every == 0:
                probing = live & (instance != Instance.SPOT)
                stale = np.where(seen, np.iinfo(np.int64).max, seen_tick)
                target = stale.argmin(axis=0)
                seen[target[probing], rows[probing]] = True
                got = probing & now[target, rows]
                probe_cost += np.where(got, probe_hours * job.spot_price, 0.0)
        observed, avail_hours, windows, last, age = _observe(
            seen, now, dt, observed, avail_hours, windows, last, age
        )
        seen_tick[seen] = t
        believed = last if full else _believed(last, t - seen_tick, dt, instance)
        lost = live & (instance == Instance.SPOT) & ~now[np.maximum(zone, 0), rows]
        instance[lost], zone[lost], overhead[lost] = Instance.NONE, -1, 0
        state = BatchState(
            hours_to_deadline=(deadline - elapsed) * unit,
            hours_total=hours_total,
            work_left_hours=work_left * unit,
            work_total_hours=work_total_hours,
            restart_hours=restart_hours,
            tick_hours=tick_hours,
            instance=instance,
            zone=zone,
            restart_left_hours=overhead * unit,
            spot_obtainable=now if full else believed,
            spot_price=job.spot_price,
            on_demand_price=job.on_demand_price,
            observed_hours=observed,
            available_hours=avail_hours,
            windows=windows,
            last_available=last,
            zones=zones,
            age_hours=age,
            plans=plans[0] if plans is not None else (),
            plan_of=plan_of,
            plan_row=plan_row,
            spent=unit * (job.spot_price * held[0] + job.on_demand_price * held[1]) + probe_cost,
            reserved=cap,
        )
        action, target = decide(state)
        action = np.where(stopped, Action.STOP, np.where(expired, Action.CONTINUE, action))
        tried = _apply(action, target, now, instance, zone, overhead, restart, rows)
        if not full:  # a launch attempt shows the policy its zone
            tried &= live
            attempt = np.zeros((n_zones, n), bool)
            attempt[target[tried], rows[tried]] = True
            attempt &= ~seen
            observed, avail_hours, windows, last, age = _observe(
                attempt, now, dt, observed, avail_hours, windows, last, age
            )
            seen_tick[attempt] = t
            home = np.where(instance == Instance.SPOT, zone, home)
        stopped |= action == Action.STOP
        running = live & (instance != Instance.NONE)
        # the tick, or what is left of it before the deadline: the overhead first, then work
        usable = np.where(running, np.minimum(parts, deadline - elapsed), 0)
        paid_overhead = np.minimum(overhead, usable)
        progress = np.minimum(usable - paid_overhead, work_left)
        used = paid_overhead + progress  # less than the tick only where the work is done
        held[0] += np.where(instance == Instance.SPOT, used, 0)
        held[1] += np.where(instance == Instance.ON_DEMAND, used, 0)
        overhead -= paid_overhead
        work_left -= progress
        done = running & (work_left <= 0)
        finish[done] = elapsed[done] + used[done]
        instance[done], zone[done] = Instance.NONE, -1
        stopped |= done
    missed = work_left > 0
    # a late job still gets finished on on-demand, so its cost is comparable
    catch_up = np.where(instance == Instance.ON_DEMAND, overhead, restart) + work_left
    cost = unit * (job.spot_price * held[0] + job.on_demand_price * held[1])
    cost = cost + np.where(missed, catch_up * unit * job.on_demand_price, 0.0) + probe_cost
    finish_hours = np.where(missed, np.nan, finish * unit)
    return [
        SimResult(cost=cost[part], missed=missed[part], finish_hours=finish_hours[part])
        for part in (slice(i * b, (i + 1) * b) for i in range(len(runs)))
    ]


def _apply(
    action: np.ndarray,
    target: np.ndarray,
    now: np.ndarray,
    instance: np.ndarray,
    zone: np.ndarray,
    overhead: np.ndarray,
    restart: np.ndarray,
    rows: np.ndarray,
) -> np.ndarray:
    """Carry out the decisions in place; where spot was launched, tried or not. A spot launch
    where spot is gone gets no instance; one already held (on-demand, or spot elsewhere)
    is kept, as live the old instance is stopped only once the new one runs."""
    spot = action == Action.SPOT
    move = spot & ~((instance == Instance.SPOT) & (zone == target))
    got = now[np.maximum(target, 0), rows]
    start = move & got
    instance[start], zone[start], overhead[start] = Instance.SPOT, target[start], restart[start]
    failed = move & ~got & (instance == Instance.NONE)
    od = (action == Action.ON_DEMAND) & (instance != Instance.ON_DEMAND)
    instance[od], zone[od], overhead[od] = Instance.ON_DEMAND, -1, restart[od]
    idle = failed | (action == Action.WAIT) | (action == Action.STOP)
    instance[idle], zone[idle], overhead[idle] = Instance.NONE, -1, 0
    return move


def _believed(
    last: np.ndarray, ticks_since: np.ndarray, dt: float, instance: np.ndarray
) -> np.ndarray:
    """What the policy takes as spot obtainable in each zone (Z, B), as live
    (``steering.policy_state``, ``move_back_excluded``): the last state seen, but a zone
    seen without spot is tried anew once that news is ``REFUSED_HOURS`` old, or
    ``MOVE_BACK_HOURS`` for a job on on-demand (live, per region: here per zone)."""
    stale = np.where(instance == Instance.ON_DEMAND, MOVE_BACK_HOURS, REFUSED_HOURS)
    return last | (ticks_since * dt >= stale - 1e-9)


def _observe(
    seen: np.ndarray,
    now: np.ndarray,
    dt: float,
    observed: np.ndarray,
    avail_hours: np.ndarray,
    windows: np.ndarray,
    last: np.ndarray,
    age: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """The zones' statistics (observed, available hours, windows, last, age) advanced by one
    tick where ``seen``, as they were elsewhere."""
    return (
        observed + seen * dt,
        avail_hours + (seen & now) * dt,
        windows + (seen & now & ~last),
        np.where(seen, now, last),
        np.where(seen, np.where(now == last, age + dt, dt), age),
    )


@dataclass(frozen=True)
class PolicySummary:
    """One policy over all start offsets: costs normalized per start, deadline misses."""

    policy: str
    mean_vs_on_demand: float
    p90_vs_on_demand: float
    mean_vs_optimal: float
    p90_vs_optimal: float
    misses: int
    jobs: int


def compare(
    traces: Sequence[Trace],
    job: TraceJob,
    offsets: np.ndarray,
    policies: Sequence[str],
    fleet: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Cost per start offset of each policy (``optimal`` included when named); ``fleet``:
    (Z', L) availability the ``broker`` policy's spot model takes as its prior."""
    matrix, gap = zone_matrix(traces)
    ticks = Ticks.of(job, gap)
    zones = tuple(t.zone for t in traces)
    out: dict[str, np.ndarray] = {}
    for name in policies:
        if name == "optimal":
            out[name] = optimal_costs(matrix, offsets, ticks, job)
        else:
            result = simulate_ticks(BATCH_POLICIES[name], matrix, offsets, ticks, job, zones, fleet)
            out[name] = np.where(result.missed, -result.cost, result.cost)  # sign = missed
    return out


def summarize(costs: dict[str, np.ndarray], on_demand_cost: float) -> list[PolicySummary]:
    """Mean and p90 of cost / on-demand and cost / optimal (negative cost = missed deadline)."""
    best = costs["optimal"]
    rows = []
    for name, signed in costs.items():
        cost = np.abs(signed)
        vs_opt = cost / best
        rows.append(
            PolicySummary(
                policy=name,
                mean_vs_on_demand=float(np.mean(cost) / on_demand_cost),
                p90_vs_on_demand=float(np.percentile(cost, 90) / on_demand_cost),
                mean_vs_optimal=float(np.mean(vs_opt)),
                p90_vs_optimal=float(np.percentile(vs_opt, 90)),
                misses=int(np.sum(signed < 0)),
                jobs=len(cost),
            )
        )
    return rows
