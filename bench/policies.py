"""Spot policies on the bundled traces: cost vs the hindsight optimum and Uniform Progress.

Every trace alone (single zone) and every region's zones together (multi-zone: the traces of
one dataset folder with the same GPU and length); work 24 h and 48 h, deadline x1.1 and x1.5,
restart 0.1 h and 0.5 h, N start offsets each, all eight jobs of a scenario in one lockstep
simulation. The broker's spot model of a scenario's zones takes as its prior what the
broker watched of every trace in their dataset folder over the same days before each start
(its "fleet"), never the job's own window or later; and, as the bundled traces are live, a
sample of the runs of the traces of the dataset folders that ended before this one began
(the zones' own when there are some, else all of them, fewer: ``pricing.spot_prior``).
Prints the figures, then one JSON line last. The row ``best_rule_hindsight`` is no policy:
per start, the cheapest of the online rules, a bound on what choosing among them buys; the
cells (scenario x job) where the broker costs more than ``CELL_LIMIT`` x Uniform Progress
are listed.

Multi-zone is simulated in three views (``broker.sim.simulator``): ``multi`` what the live
broker observes (its home zone, its launch attempts); ``multi_probe`` the same with a
billed ``--probe-hours`` spot launch in the zone seen longest ago every
``--probe-every-hours`` while the job is not on spot; ``multi_full`` every zone every tick
for free (the figure before issue 22).

    python bench/policies.py [--starts 200] [--coarsen-below 60] [--probe-every-hours 1]
                             [--probe-hours 0.05]

Traces sampled faster than ``--coarsen-below`` seconds (the 32 s preemption traces) are
resampled to the smallest multiple above it, a block available only if all of it was: the
optimum's DP is quadratic in ticks and would otherwise dominate the run on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np

from broker.core.policy_vectorized import BATCH_POLICIES
from broker.core.spot_chain import run_lengths
from broker.core.spot_model import FLEET_PRIOR_RUNS, PRIOR_RUNS, prior_sample
from broker.sim.hindsight import optimal_costs
from broker.sim.history import start_plans
from broker.sim.scenario import Ticks, TraceJob, start_offsets, zone_matrix
from broker.sim.simulator import simulate_runs
from pricing.traces import Trace, bundled_traces

POLICIES = ("on_demand", "greedy", "uniform_progress", "broker")
PICK = "best_rule_hindsight"
WORK = (24.0, 48.0)
SLACK = (1.1, 1.5)
RESTART = (0.1, 0.5)
SPOT_PRICE, ON_DEMAND_PRICE = 0.92, 3.06
CELL_LIMIT = 1.01  # a cell (scenario x job) where the broker costs more than this x UP is listed


def coarsen(trace: Trace, below: float) -> Trace:
    if trace.gap_seconds >= below:
        return trace
    factor = math.ceil(below / trace.gap_seconds)
    blocks = len(trace.available) // factor
    available = trace.available[: blocks * factor].reshape(blocks, factor).all(axis=1)
    return replace(trace, gap_seconds=trace.gap_seconds * factor, available=available)


def scenarios(traces: tuple[Trace, ...]) -> list[tuple[str, list[Trace]]]:
    """Each trace alone, then each region's zones (same folder, GPU, count, length)."""
    out = [(t.name, [t]) for t in traces]
    regions: dict[tuple, list[Trace]] = defaultdict(list)
    for t in traces:
        folder = t.name.split("/")[0]
        region = t.zone.rstrip("abcdefgh")
        regions[(folder, region, t.gpu, t.gpu_count, len(t.available))].append(t)
    for (folder, region, gpu, count, _), zones in sorted(regions.items()):
        if len(zones) > 1:
            out.append((f"{folder}/{region}*_{gpu.lower()}_{count} (x{len(zones)})", zones))
    return out


def fleet_of(traces: tuple[Trace, ...], zones: list[Trace]) -> np.ndarray:
    """What the broker watched besides: every trace of the zones' dataset folder (zones and
    instance types over the same days), the prior of its spot model."""
    folder = zones[0].name.split("/")[0]
    length = len(zones[0].available)
    same = [t for t in traces if t.name.split("/")[0] == folder and len(t.available) == length]
    return zone_matrix(same)[0]


def recorded_from(trace: Trace) -> datetime:
    """When a trace's recording began: its dataset folder's date (``aws-MM-DD-YYYY``)."""
    return datetime.strptime(trace.name.split("/")[0].removeprefix("aws-"), "%m-%d-%Y")


def prior_of(traces: tuple[Trace, ...], zones: list[Trace]) -> tuple[np.ndarray, ...] | None:
    """What the broker knew of spot before the zones' traces began, as live from the bundled
    traces: a sample of the windows and outages of the traces that ended by then, the zones'
    own (same zone and GPU) if any, else all of them, fewer; None when none had."""
    start = recorded_from(zones[0])
    done = [t for t in traces if recorded_from(t) + timedelta(hours=t.hours) <= start]
    own = [t for t in done if any((t.zone, t.gpu) == (z.zone, z.gpu) for z in zones)]
    chosen, n = (own, PRIOR_RUNS) if own else (done, FLEET_PRIOR_RUNS)
    if not chosen:
        return None
    runs = [run_lengths(t.available, t.gap_seconds / 3600.0) for t in chosen]
    return tuple(
        np.array(prior_sample(np.concatenate([r[kind] for r in runs]), n)) for kind in (0, 1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--coarsen-below", type=float, default=60.0)
    parser.add_argument(
        "--probe-every-hours", type=float, default=1.0, help="multi_probe: probe interval"
    )
    parser.add_argument(
        "--probe-hours", type=float, default=0.05, help="multi_probe: billed spot time a probe"
    )
    args = parser.parse_args()
    traces = tuple(coarsen(t, args.coarsen_below) for t in bundled_traces())
    # rows[(scope, policy)] -> list of per-case arrays of cost / optimal and cost / UP
    vs_opt: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    vs_up: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    misses: dict[tuple[str, str], int] = defaultdict(int)
    cells: list[tuple[str, str, float]] = []  # (scope, scenario and job, mean broker / UP)
    sim_seconds, sim_jobs, dp_seconds = 0.0, 0, 0.0
    plan_seconds, plan_count = 0.0, 0  # the broker's spot plans: one per job and refit day
    for name, zones in scenarios(traces):
        matrix, gap = zone_matrix(zones)
        offsets = start_offsets(matrix.shape[1], args.starts)
        labels = tuple(z.zone for z in zones)
        jobs = [
            TraceJob(work, work * slack, restart, SPOT_PRICE, ON_DEMAND_PRICE)
            for work, slack, restart in itertools.product(WORK, SLACK, RESTART)
        ]
        runs = [(Ticks.of(job, gap), job) for job in jobs]
        began = time.perf_counter()
        best = [optimal_costs(matrix, offsets, ticks, job) for ticks, job in runs]
        dp_seconds += time.perf_counter() - began
        began = time.perf_counter()
        plans = start_plans(
            matrix, offsets, gap / 3600.0, runs, fleet_of(traces, zones), prior_of(traces, zones)
        )
        plan_seconds += time.perf_counter() - began
        plan_count += len(runs) * plans[0][0].want.shape[1]  # runs x refit days
        probe = max(1, round(args.probe_every_hours * 3600.0 / gap))  # ticks
        views = (
            [("single", "full", 0)]
            if len(zones) == 1
            else [
                ("multi_full", "full", 0),
                ("multi", "observed", 0),
                ("multi_probe", "observed", probe),
            ]
        )
        for scope, view, every in views:
            costs: dict[str, list[np.ndarray]] = {}
            for policy in POLICIES:
                began = time.perf_counter()
                results = simulate_runs(
                    BATCH_POLICIES[policy],
                    matrix,
                    offsets,
                    runs,
                    labels,
                    plans=plans,
                    view=view,
                    probe_every=every,
                    probe_hours=args.probe_hours,
                )
                sim_seconds += time.perf_counter() - began
                sim_jobs += len(offsets) * len(runs)
                costs[policy] = [r.cost for r in results]
                misses[(scope, policy)] += sum(int(r.missed.sum()) for r in results)
                for r, bound in zip(results, best, strict=True):
                    if (r.cost < bound - 1e-6).any():
                        raise AssertionError(f"{policy} beat the optimum on {name}")
            # not a policy: per start, the cheapest of the online rules, picked with hindsight
            # (how far choosing among the rules could go)
            costs[PICK] = [
                np.minimum.reduce([costs[p][i] for p in POLICIES if p != "on_demand"])
                for i in range(len(runs))
            ]
            for policy, per_job in costs.items():
                for i, cost in enumerate(per_job):
                    vs_opt[(scope, policy)].append(cost / best[i])
                    vs_up[(scope, policy)].append(cost / costs["uniform_progress"][i])
            for job, ratio in zip(jobs, vs_up[(scope, "broker")][-len(jobs) :], strict=True):
                label = f"{name} {job.work_hours:g}h x{job.deadline_hours / job.work_hours:g}"
                cells.append((scope, f"{label} r{job.restart_hours:g}", float(ratio.mean())))
        print(f"  done {name}", flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\n{'scope':11} {'policy':20} {'mean/opt':>9} {'p90/opt':>8} {'mean/UP':>8} misses")
    for (scope, policy), ratios in vs_opt.items():
        per_case = np.array([r.mean() for r in ratios])
        all_jobs = np.concatenate(ratios)
        row = {
            "mean_vs_optimal": float(per_case.mean()),
            "p90_vs_optimal": float(np.percentile(all_jobs, 90)),
            "mean_vs_uniform_progress": float(np.mean([r.mean() for r in vs_up[(scope, policy)]])),
            "misses": misses[(scope, policy)],
            "jobs": int(all_jobs.size),
        }
        summary.setdefault(scope, {})[policy] = row
        print(
            f"{scope:11} {policy:20} {row['mean_vs_optimal']:9.3f} {row['p90_vs_optimal']:8.3f}"
            f" {row['mean_vs_uniform_progress']:8.3f} {row['misses']:6d}"
        )
    print(f"({PICK}: per start, the cheapest of greedy / uniform_progress / broker)")
    over = sorted((c for c in cells if c[2] > CELL_LIMIT), key=lambda c: -c[2])
    for scope in summary:
        summary[scope]["broker"]["cells_over_uniform_progress"] = sum(c[0] == scope for c in over)
        summary[scope]["broker"]["cells"] = sum(c[0] == scope for c in cells)
    print(f"broker > {CELL_LIMIT} x UP (mean over starts) in {len(over)} of {len(cells)} cells")
    for scope, label, ratio in over:
        print(f"  {scope:11} {ratio:6.3f}  {label}")
    for scope, rows in summary.items():
        greedy, up = rows["greedy"]["mean_vs_optimal"], rows["uniform_progress"]["mean_vs_optimal"]
        closed = (greedy - up) / (greedy - 1.0) if greedy > 1.0 else float("nan")
        rows["uniform_progress"]["share_of_greedy_gap_closed"] = closed
        print(f"{scope}: Uniform Progress closes {closed:.0%} of greedy's gap to optimal")
    speed = sim_jobs / sim_seconds
    print(
        f"simulator: {speed:,.0f} job-traces/s on one core ({sim_jobs} runs, "
        f"{sim_seconds:.1f} s); optimal DP {dp_seconds:.1f} s; broker's spot plans "
        f"{plan_count} ({plan_seconds:.1f} s, {plan_seconds / plan_count:.3f} s each)"
    )
    print(
        json.dumps(
            {
                "bench": "policies",
                "starts": args.starts,
                "summary": summary,
                "job_traces_per_second": speed,
                "optimal_dp_seconds": dp_seconds,
                "broker_plans": plan_count,
                "broker_plan_seconds": plan_seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
