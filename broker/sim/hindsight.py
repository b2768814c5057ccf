"""Hindsight-optimal cost of a job on a known trace: the bound no online policy can beat.

Dynamic programming on the simulator's model (``broker.sim.simulator``), in its parts of a
tick (``scenario.Ticks``), over tick x waste x instance, where waste = elapsed - work done
(idle ticks plus restart overheads): knowing the tick and the waste is knowing the work
done, and waste only ranges over the slack (deadline - work), far fewer values than the
work. Vectorized over waste and over the start offsets (in chunks that fit a cache). A start
is one jump of the whole ticks its overhead reaches into (the overhead, then work for the
rest of its last tick), paid at the new instance's price, with the overhead's parts as waste;
a spot start counts only if its zone stays available through those ticks (one that is lost
before is never cheaper than staying idle). A state whose work done reaches the job's has
finished within its last tick and pays only up to then.
"""

from __future__ import annotations

import numpy as np

from broker.sim.scenario import Ticks, TraceJob, job_windows

CHUNK_CELLS = 250_000  # zones x offsets x waste a chunk of offsets works on (fits a cache)


def optimal_costs(
    matrix: np.ndarray, offsets: np.ndarray, ticks: Ticks, job: TraceJob
) -> np.ndarray:
    """Least cost per start offset on the (Z, L) availability ``matrix``; inf if infeasible."""
    offsets = np.asarray(offsets)
    if ticks.work <= 0:
        return np.zeros(len(offsets))
    width = max(ticks.deadline - ticks.work + 1, 1)
    chunk = max(1, CHUNK_CELLS // (matrix.shape[0] * width))
    return np.concatenate(
        [
            _optimal(matrix, offsets[i : i + chunk], ticks, job)
            for i in range(0, len(offsets), chunk)
        ]
        or [np.zeros(0)]
    )


def _optimal(matrix: np.ndarray, offsets: np.ndarray, ticks: Ticks, job: TraceJob) -> np.ndarray:
    n_zones, n = matrix.shape[0], len(offsets)
    p, work, q = ticks.parts, ticks.work, ticks.restart
    slack = ticks.deadline - work
    best = np.full(n, np.inf)
    if slack < q:
        return best
    lag = -(-q // p)  # whole ticks from a start to the tick boundary after its overhead
    end = ticks.span
    width = slack + 1
    window = job_windows(matrix, offsets, end + lag + 1)  # (Z, B, T)
    # ok[z, b, t]: spot in z stays available over the ticks [t, t + lag)
    run = np.concatenate([np.zeros((n_zones, n, 1), np.int64), np.cumsum(window, axis=2)], axis=2)
    ok = (run[:, :, lag:] - run[:, :, : run.shape[2] - lag]) == lag
    spot_part, od_part = ticks.part_hours * job.spot_price, ticks.part_hours * job.on_demand_price
    spot_step, od_step = p * spot_part, p * od_part
    waste = np.arange(width)
    idle = np.full((n, width), np.inf)
    idle[:, 0] = 0.0
    # the instances' states hold cost - t x (a tick's price): holding one adds nothing
    spot = np.full((n_zones, n, width), np.inf)
    od = np.full((n, width), np.inf)
    # starts land lag ticks later with q more waste: the idle costs they start from, in a
    # ring buffer indexed by tick % (lag + 1), each slot written whole after it is read
    land = np.full((lag + 1, n, width), np.inf)
    reach = max(lag, 1) * p  # how far below the unfinished states a finished one can be
    for t in range(end + 1):
        # live states: waste at most the time elapsed, work done short of the job's
        hi, lo = min(width, t * p + 1), min(width, max(0, t * p - work + 1))
        below = max(0, lo - reach)
        if q > 0 and t >= lag:
            # lag ticks paid from idle at t - lag: cost - t x step = idle - (t - lag) x step
            came = land[t % (lag + 1), :, below:hi]
            np.minimum(
                spot[:, :, below:hi],
                came - (t - lag) * spot_step,
                out=spot[:, :, below:hi],
                where=ok[:, :, t - lag, None],
            )
            np.minimum(od[:, below:hi], came - (t - lag) * od_step, out=od[:, below:hi])
        if lo > below:
            # done: work done (t x p - waste) reached the job's within the last tick, by
            # ``over`` parts it does not pay for; it stops there
            over = t * p - work - waste[below:lo]
            paid = (spot[:, :, below:lo] - over * spot_part).min(axis=(0, 2)) + t * spot_step
            np.minimum(best, paid, out=best)
            paid = (od[:, below:lo] - over * od_part).min(axis=1) + t * od_step
            np.minimum(best, paid, out=best)
            spot[:, :, below:lo] = np.inf
            od[:, below:lo] = np.inf
        # stopping is free, and a preempted spot instance leaves the job idle
        live = slice(lo, hi)
        np.minimum(idle[:, live], spot[:, :, live].min(axis=0) + t * spot_step, out=idle[:, live])
        np.minimum(idle[:, live], od[:, live] + t * od_step, out=idle[:, live])
        if t == end:
            break
        held = spot[:, :, live]
        held[~window[:, :, t]] = np.inf  # lost where spot is gone
        if q == 0:
            now = window[:, :, t, None]
            np.minimum(held, idle[:, live] - t * spot_step, out=held, where=now)
            np.minimum(od[:, live], idle[:, live] - t * od_step, out=od[:, live])
        else:
            slot = land[(t + lag) % (lag + 1)]
            slot[:, :q] = np.inf
            slot[:, q:] = idle[:, : width - q]
        # an idle tick: p parts more waste
        idle[:, min(p, width) :] = idle[:, : max(width - p, 0)].copy()
        idle[:, : min(p, width)] = np.inf
    return best
