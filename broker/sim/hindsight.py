"""Hindsight-optimal cost of a job on a known trace: the bound no online policy can beat.

Dynamic programming on the simulator's model (``broker.sim.simulator``) over time x waste x
instance, where waste = elapsed ticks - work ticks done (idle ticks plus restart overheads):
knowing the tick and the waste is knowing the work done, and waste only ranges over the
slack (deadline - work), far fewer values than the work. Vectorized over waste and over all
start offsets at once. A start is one jump of ``restart`` ticks (no progress, paid at the new
instance's price); a spot start counts only if its zone stays available through the
overhead (one that is lost before is never cheaper than staying idle).
"""

from __future__ import annotations

import numpy as np

from broker.sim.scenario import Ticks, TraceJob, job_windows


def optimal_costs(
    matrix: np.ndarray, offsets: np.ndarray, ticks: Ticks, job: TraceJob
) -> np.ndarray:
    """Least cost per start offset on the (Z, L) availability ``matrix``; inf if infeasible."""
    n_zones, n = matrix.shape[0], len(offsets)
    slack = ticks.deadline - ticks.work
    best = np.full(n, np.inf)
    q = ticks.restart
    if slack < q or ticks.work <= 0:
        return np.zeros(n) if ticks.work <= 0 else best
    width = slack + 1
    window = job_windows(matrix, offsets, ticks.deadline + q + 1)  # (Z, B, T)
    # ok[z, b, t]: spot in z stays available over the overhead ticks [t, t + q)
    run = np.concatenate([np.zeros((n_zones, n, 1), np.int64), np.cumsum(window, axis=2)], axis=2)
    ok = (run[:, :, q:] - run[:, :, : run.shape[2] - q]) == q
    spot_step, od_step = ticks.hours * job.spot_price, ticks.hours * job.on_demand_price
    idle = np.full((n, width), np.inf)
    idle[:, 0] = 0.0
    spot = np.full((n_zones, n, width), np.inf)
    od = np.full((n, width), np.inf)
    # starts land q ticks later with q more waste; ring buffer indexed by tick % (q + 1)
    land_spot = np.full((q + 1, n_zones, n, width), np.inf)
    land_od = np.full((q + 1, n, width), np.inf)
    for t in range(ticks.deadline + 1):
        slot = t % (q + 1)
        np.minimum(spot, land_spot[slot], out=spot)
        np.minimum(od, land_od[slot], out=od)
        land_spot[slot] = np.inf
        land_od[slot] = np.inf
        # stopping is free, and a preempted spot instance leaves the job idle
        np.minimum(idle, spot.min(axis=0), out=idle)
        np.minimum(idle, od, out=idle)
        waste = t - ticks.work
        if 0 <= waste <= slack:
            np.minimum(best, idle[:, waste], out=best)
        if t == ticks.deadline:
            break
        now = window[:, :, t, None]
        spot = np.where(now, spot, np.inf)
        if q == 0:
            np.minimum(spot, np.where(now, idle, np.inf), out=spot)
            np.minimum(od, idle, out=od)
        else:
            target = (t + q) % (q + 1)
            shifted = idle[:, : width - q]
            land_spot[target][:, :, q:] = np.where(
                ok[:, :, t, None], shifted + q * spot_step, np.inf
            )
            land_od[target][:, q:] = shifted + q * od_step
        spot += spot_step
        od += od_step
        idle[:, 1:] = idle[:, :-1].copy()
        idle[:, 0] = np.inf
    return best
