"""Live vs simulated: the same jobs through the live local stack and through the simulator.

Each job is pinned (provider, region, GPU type; work given in hours of that GPU) so that its
plan lands where the market replay plays one chosen bundled trace (``aws-02-15-2023``, 195 s
samples) from one chosen start: every spot zone of that region and GPU follows the trace, its
chosen tick beginning when the broker admits the job (``AnchoredTrace``). The live run is the
embedded stack (API, Celery worker and beat, SQLite + file transport, moto and the GCE fake,
light in-process instances) at ``--scale``, its tick one trace sample (``tick_seconds = 195 /
scale``), the scale held (the pacer may not lower it, which would shorten the live tick); the
instances run at the speed the broker predicts (the local clouds' per-GPU deviation is undone
per job), so a job's work in hours is the same on both sides. Then each job goes through the
simulator (``broker`` policy, single zone) on the same trace from the same tick: the same
work, deadline (from admission), restart overhead (``Planning.restart_hours``, what the live
broker assumes), spot and on-demand prices (the live plan's offer) and tick, and the same
knowledge: what the live policy believed of the job's zone at admission (the shared spot
model's history, spot obtainable or not) and its plan (``policy.plan_for``), the zone seen
from then on only as live sees it (the observed view: while the job waits for spot or holds
it, or launches there). The ``past`` column is the old footing, ``bench/policies.py``'s: the
trace's past before the start (the dataset folder's traces over the same days, the runs of
traces recorded before) and the full view.

Prints a row per job (live and simulated cost, their ratio, deadline met on each side, and
how the live attempts ended), then the median ratio, the largest |ratio - 1| and how many
deadline outcomes agree against the goal (median within 5 %, none beyond 15 %, the same
outcomes), then one JSON line last.

    python bench/live_vs_sim.py [--jobs 6] [--scale 195] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.policies import fleet_of, prior_of  # noqa: E402
from broker.core.money import MICROS_PER_DOLLAR  # noqa: E402
from broker.core.policy import EPS, Action, Instance, ZoneHistory, plan_for  # noqa: E402
from broker.core.policy_vectorized import BatchState, broker_batch  # noqa: E402
from broker.core.spot_mdp import SpotPlan  # noqa: E402
from broker.sim.history import HISTORY_HOURS, start_plans  # noqa: E402
from broker.sim.scenario import Ticks, TraceJob, zone_matrix  # noqa: E402
from broker.sim.simulator import simulate_runs  # noqa: E402
from pricing.traces import Trace, bundled_traces  # noqa: E402

FOLDER = "aws-02-15-2023"  # its traces share one sample interval (195 s): the common tick
# (provider, region, GPU): distinct regions first, so jobs share as few zones as possible
SLOTS = (
    ("aws", "us-east-1", "V100"),
    ("gcp", "us-east1", "P100"),
    ("aws", "us-east-2", "T4"),
    ("gcp", "us-central1", "A100-80GB"),
    ("aws", "us-west-2", "A10G"),
    ("aws", "us-east-1", "L4"),
    ("aws", "us-west-2", "L4"),
    ("gcp", "us-central1", "L4"),
)
WORK_HOURS = (2.0, 4.5)
SLACK = (1.3, 1.6)
GOAL_MEDIAN, GOAL_MAX = 0.05, 0.15


@dataclass(frozen=True)
class AnchoredTrace(Trace):
    """A trace replayed from tick ``start`` on, that tick beginning at the market position
    ``anchor_seconds`` (``MarketReplay.position_seconds``), so a job admitted at any moment
    sees its chosen segment from its first instant."""

    start: int = 0
    anchor_seconds: float = 0.0

    def available_at(self, seconds_since_start: float) -> bool:
        ticks = math.floor((seconds_since_start - self.anchor_seconds) / self.gap_seconds)
        return bool(self.available[(self.start + ticks) % len(self.available)])


def anchored(trace: Trace, start: int, anchor_seconds: float) -> AnchoredTrace:
    """``trace`` replayed from tick ``start``, which begins at ``anchor_seconds``."""
    base = {f.name: getattr(trace, f.name) for f in fields(Trace)}
    return AnchoredTrace(**base, start=start, anchor_seconds=anchor_seconds)


@dataclass(frozen=True)
class Pick:
    """One job of the bench: where it runs, on which trace from which tick, how long."""

    name: str
    provider: str
    region: str
    gpu: str
    trace: Trace
    start: int
    work_hours: float
    slack: float


@dataclass(frozen=True)
class LiveStart:
    """What the live broker had of a job once it admitted it."""

    created_at: datetime
    deadline: datetime
    work_hours: float  # its total work at its plan's speed
    restart_hours: float
    spot_micros: int  # $/h of its plan's offer, in micro-dollars
    on_demand_micros: int
    max_cost_micros: int  # what the budget net's holds may reach
    known: ZoneHistory = ZoneHistory()  # what its policy believed of its plan's zone then
    plan: SpotPlan | None = None  # its policy's plan then (``policy.plan_for``)


def known_history(live: LiveStart) -> tuple[np.ndarray, ...]:
    """``simulate_runs``'s ``history`` of one zone and one start: what the live broker knew."""
    seen = live.known
    return tuple(
        np.array([[value]])
        for value in (
            seen.observed_hours,
            seen.available_hours,
            seen.windows,
            seen.last_available,
            seen.age_hours,
        )
    )


def trace_job(live: LiveStart) -> TraceJob:
    """The simulator's job for a live one: the same work, deadline from admission, restart
    overhead and prices; the reservation the broker's rule gives (``scenario.reserved``), up
    to its max_cost when the budget net asks to hold more, as live."""
    return TraceJob(
        work_hours=live.work_hours,
        deadline_hours=(live.deadline - live.created_at).total_seconds() / 3600.0,
        restart_hours=live.restart_hours,
        spot_price=live.spot_micros / MICROS_PER_DOLLAR,
        on_demand_price=live.on_demand_micros / MICROS_PER_DOLLAR,
        max_cost=live.max_cost_micros / MICROS_PER_DOLLAR,
    )


def pick_start(trace: Trace, span: int, rng: random.Random) -> int:
    """A start with a full history before it (``HISTORY_HOURS``) and its whole deadline
    within the trace, where spot changes at least once in that span when such exists."""
    lo = min(int(HISTORY_HOURS * 3600 / trace.gap_seconds), len(trace.available) - span - 1)
    starts = range(max(lo, 0), len(trace.available) - span)
    changes = np.flatnonzero(np.diff(trace.available.astype(np.int8)) != 0)
    lively = [s for s in starts if np.any((changes >= s) & (changes < s + span - 1))]
    return rng.choice(lively or list(starts))


def pick_jobs(count: int, seed: int) -> list[Pick]:
    """``count`` jobs (at most one per slot), each on a trace of ``FOLDER`` drawn by ``seed``."""
    rng = random.Random(seed)
    traces = [t for t in bundled_traces() if t.name.startswith(FOLDER + "/")]
    picks = []
    for i, (provider, region, gpu) in enumerate(SLOTS[:count]):
        trace = rng.choice(traces)
        work = round(rng.uniform(*WORK_HOURS), 2)
        slack = round(rng.uniform(*SLACK), 2)
        span = math.ceil(work * slack * 3600 / trace.gap_seconds) + 1
        picks.append(
            Pick(
                name=f"j{i}-{provider}-{region}-{gpu.lower()}",
                provider=provider,
                region=region,
                gpu=gpu,
                trace=trace,
                start=pick_start(trace, span, rng),
                work_hours=work,
                slack=slack,
            )
        )
    return picks


def starting_on_demand(state: BatchState) -> tuple[np.ndarray, np.ndarray]:
    """The ``broker`` policy, but a job with nothing running at its first instant starts on
    on-demand: what the live broker does when its admission plan is on-demand."""
    action, target = broker_batch(state)
    first = (state.hours_total - state.hours_to_deadline <= EPS) & (state.instance == Instance.NONE)
    return np.where(first, int(Action.ON_DEMAND), action), target


def simulate(
    pick: Pick, live: LiveStart, start_on_demand: bool = False, trace_past: bool = False
) -> dict[str, Any]:
    """The job on its trace from its start tick, the ``broker`` policy, one zone (started on
    on-demand with ``start_on_demand``), knowing at its start what the live broker knew
    (its zone's history and its plan) and seeing the zone only as live (the observed view:
    while it waits or holds spot, or tries to launch), or with ``trace_past`` on
    ``bench/policies.py``'s footing: the trace's past before the start, the full view."""
    job = trace_job(live)
    matrix, gap = zone_matrix([pick.trace])
    offsets = np.array([pick.start])
    runs = [(Ticks.of(job, gap), job)]
    history = None
    if trace_past:
        every = bundled_traces()
        plans = start_plans(
            matrix,
            offsets,
            gap / 3600.0,
            runs,
            fleet_of(every, [pick.trace]),
            prior_of(every, [pick.trace]),
        )
    else:
        assert live.plan is not None, "the live broker's plan at admission"
        plans, history = ((live.plan,), np.zeros(1, np.int64)), known_history(live)
    decide = starting_on_demand if start_on_demand else broker_batch
    view = "full" if trace_past else "observed"
    result = simulate_runs(
        decide, matrix, offsets, runs, (pick.trace.zone,), plans=plans, view=view, history=history
    )[0]
    return {"cost": float(result.cost[0]), "met": not bool(result.missed[0])}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median live/sim cost ratio, largest |ratio - 1|, deadline outcomes that agree, and
    whether that meets the goal."""
    ratios = [r["ratio"] for r in rows]
    median = statistics.median(ratios) if ratios else math.nan
    worst = max((abs(r - 1.0) for r in ratios), default=math.nan)
    agree = sum(r["live_met"] == r["sim_met"] for r in rows)
    return {
        "median_ratio": median,
        "max_abs_ratio_minus_1": worst,
        "outcomes_agree": agree,
        "jobs": len(rows),
        "goal_met": bool(
            rows and abs(median - 1.0) <= GOAL_MEDIAN and worst <= GOAL_MAX and agree == len(rows)
        ),
    }


def against(rows: list[dict[str, Any]], ratio: str, sim_met: str) -> dict[str, Any]:
    """``summary`` of the rows against another simulated run: its ratio and outcome keys."""
    return summary(
        [{"ratio": r[ratio], "live_met": r["live_met"], "sim_met": r[sim_met]} for r in rows]
    )


# -- the live run ------------------------------------------------------------------------------


def zones_of(cloud: Any, provider: str, region: str) -> list[str]:
    """The zone names the local cloud serves in ``region`` (its market's keys)."""
    from providers.local.aws import zone_names

    if provider == "aws":
        return zone_names([region])
    return [z for z in cloud.gcp_zones if z.rsplit("-", 1)[0] == region]


def play(cloud: Any, pick: Pick, at: datetime) -> None:
    """Every zone of the pick's region replays its trace for its GPU from its start at ``at``."""
    market = cloud.market
    trace = anchored(pick.trace, pick.start, market.position_seconds(at))
    for zone in zones_of(cloud, pick.provider, pick.region):
        market.assignments[(pick.provider, zone, pick.gpu.upper())] = trace


def spec_of(pick: Pick, now: datetime) -> dict[str, Any]:
    """The job's REST spec: work in hours of its GPU, its region and GPU pinned, ``auto``."""
    return {
        "name": pick.name,
        "workload": {"reference_gpu_hours": pick.work_hours, "reference_gpu": pick.gpu},
        "resources": {
            "gpus": 1,
            "gpu_types": [pick.gpu],
            "providers": [pick.provider],
            "regions": [pick.region],
        },
        "deadline": (now + timedelta(hours=pick.work_hours * pick.slack)).isoformat(),
        "max_cost": "500.00",
        "market": "auto",
        "run": {"command": "python train.py"},
    }


def believed(state: Any) -> ZoneHistory:
    """The history of a policy state's first zone (its plan's), its last state what the
    policy takes as obtainable there and its age counting only for that state, as
    ``policy.broker`` reads them."""
    seen = state.history.zones.get(state.zones[0], ZoneHistory())
    obtainable = bool(state.spot_obtainable[0])
    age = seen.age_hours if seen.last_available == obtainable else 0.0
    return replace(seen, last_available=obtainable, age_hours=age)


def live_start(session: Any, job: Any, tick_hours: float) -> LiveStart:
    """What the broker planned the job on at admission (its plan's speed and offer) and
    what its policy knew then (its plan's zone's history, its plan)."""
    from broker import clock
    from broker.services.plans import job_plan
    from broker.services.quoting import get_planning
    from broker.services.reservations import offer_prices
    from broker.services.steering import policy_state

    planning = get_planning()
    plan = job_plan(job)
    assert plan is not None, f"{job.id} has no plan"
    rate = planning.rate(session, job, plan.gpu, plan.gpu_count, plan.nodes)
    listed = offer_prices(
        planning, plan.provider, plan.zone, plan.instance_type, plan.gpu, plan.gpu_count
    )
    spot, on_demand = listed if listed is not None else (-1, -1)
    spot = spot if spot >= 0 else on_demand
    state = policy_state(planning, session, job, None, clock.now(), tick_hours)
    assert state is not None, f"{job.id}: the policy cannot rate its plan"
    return LiveStart(
        created_at=job.created_at,
        deadline=job.deadline,
        work_hours=job.total_work / rate,
        restart_hours=planning.restart_hours(job),
        spot_micros=spot if spot >= 0 else plan.price_per_hour_micros,
        on_demand_micros=on_demand if on_demand >= 0 else plan.price_per_hour_micros,
        max_cost_micros=job.max_cost_micros,
        known=believed(state),
        plan=plan_for(state),
    )


def run_live(picks: list[Pick], scale: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every pick through the embedded stack at once; per job its start facts and outcome."""
    from sqlmodel import Session, select

    from broker import clock
    from broker.client import BrokerClient
    from broker.core.job_status import TERMINAL, deadline_met
    from broker.db.engine import get_engine
    from broker.db.models import Attempt, Job
    from broker.devstack.stack import EmbeddedStack
    from broker.services.ledger import job_spent
    from providers.local.pace import true_speed_factor

    gap = picks[0].trace.gap_seconds
    folder = Path(tempfile.mkdtemp(prefix="broker-live-vs-sim-"))
    stack = EmbeddedStack(
        folder,
        scale=scale,
        tick_seconds=gap / scale,  # one live tick = one trace sample
        min_scale=scale,  # a lowered scale would shorten the live tick
        instance_runner="light",
        extra_env={"BROKER_CELERY_QUEUE": f"broker-lvs-{secrets.token_hex(4)}"},
    )
    out: list[dict[str, Any]] = []
    with stack:
        admin = BrokerClient(stack.api_url, stack.admin_token, timeout=60)
        team = admin.create_team("live-vs-sim", "100000.00", period="total")
        api = admin.with_token(admin.create_key(team["id"], "b")["token"])
        engine = get_engine()
        _wait_warm(admin)
        ids: dict[str, str] = {}
        for pick in picks:
            play(stack.cloud, pick, clock.now())  # in place before the first launch
            job_id = api.submit_job(spec_of(pick, clock.now()))["id"]
            with Session(engine) as session:
                job = session.get(Job, job_id)
                assert job is not None
                play(stack.cloud, pick, job.created_at)  # its segment from its admission on
                start = live_start(session, job, gap / 3600.0)
                out.append({"pick": pick, "start": start})
            # the local cloud's GPUs deviate from the model; here they run as predicted
            stack.speed_overrides[job_id] = 1.0 / true_speed_factor("reference", pick.gpu)
            ids[pick.name] = job_id
        last = max(row["start"].deadline for row in out)
        began = time.monotonic()
        limit = began + (last - clock.now()).total_seconds() / scale + 120.0
        while time.monotonic() < limit:
            with Session(engine) as session:
                statuses = [session.get(Job, i).status for i in ids.values()]  # type: ignore[union-attr]
            if all(s in TERMINAL for s in statuses):
                break
            time.sleep(1.0)
        wall = time.monotonic() - began
        with Session(engine) as session:
            for row in out:
                job = session.get(Job, ids[row["pick"].name])
                assert job is not None
                attempts = sorted(
                    session.exec(select(Attempt).where(Attempt.job_id == job.id)).all(),
                    key=lambda a: a.started_at or a.ended_at or job.deadline,
                )
                row["job_id"] = job.id
                plan = job.plan or {}
                row["plan_market"] = plan.get("market")
                first = min((a.started_at for a in attempts if a.started_at), default=None)
                row["first_start_h"] = (
                    (first - job.created_at).total_seconds() / 3600.0 if first else None
                )
                row["status"] = job.status
                row["cost"] = job_spent(session, job.id) / MICROS_PER_DOLLAR
                row["met"] = deadline_met(job.status, job.completed_at, job.deadline)
                row["attempts"] = " ".join(
                    f"{'S' if a.market == 'spot' else 'OD'}:{a.end_reason or a.status}"
                    for a in attempts
                )
                row["spot_h"], row["od_h"] = (
                    sum(a.billed_seconds for a in attempts if a.market == market) / 3600.0
                    for market in ("spot", "on_demand")
                )
        lags = _lags(stack.lag_log_path, scale)
        api.close()
        admin.close()
    return out, {"wall_seconds": round(wall, 1), "data_dir": str(folder), **lags}


def _wait_warm(admin: Any, limit_seconds: float = 90.0) -> None:
    """Until ``/healthz`` says the workers and beat are alive: jobs admitted while the
    worker still boots would wait for their first launch, which no simulated job does."""
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        if admin.health().get("status") == "ok":
            return
        time.sleep(1.0)
    print(f"warning: the stack was not healthy after {limit_seconds:g} s; submitting anyway")


def _lags(path: Path, scale: float) -> dict[str, float | None]:
    """Median and p90 of the control loop's task delays left in the lag log, broker seconds."""
    try:
        delays = [float(line.split()[1]) * scale for line in path.read_text().splitlines()]
    except (OSError, IndexError, ValueError):
        delays = []
    if not delays:
        return {"loop_lag_p50_s": None, "loop_lag_p90_s": None}
    return {
        "loop_lag_p50_s": round(float(np.percentile(delays, 50)), 1),
        "loop_lag_p90_s": round(float(np.percentile(delays, 90)), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6, help=f"at most {len(SLOTS)}")
    parser.add_argument("--scale", type=float, default=195.0, help="broker s per wall s")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 1 <= args.jobs <= len(SLOTS):
        parser.error(f"--jobs must be 1..{len(SLOTS)}")
    picks = pick_jobs(args.jobs, args.seed)
    print(f"{len(picks)} jobs at scale {args.scale:g} (tick {picks[0].trace.gap_seconds:g} s)")
    live, run = run_live(picks, args.scale)
    rows = []
    for row in live:
        pick, start = row["pick"], row["start"]
        sim = simulate(pick, start)
        # where live started on on-demand (its admission plan), the simulator started so
        od_start = simulate(pick, start, start_on_demand=row["plan_market"] == "on_demand")
        past = simulate(pick, start, trace_past=True)
        rows.append(
            {
                "job": pick.name,
                "trace": f"{pick.trace.name}@{pick.start}",
                "work_h": round(start.work_hours, 3),
                "deadline_h": round(trace_job(start).deadline_hours, 3),
                "restart_h": round(start.restart_hours, 4),
                "spot_per_h": start.spot_micros / MICROS_PER_DOLLAR,
                "on_demand_per_h": start.on_demand_micros / MICROS_PER_DOLLAR,
                "live_cost": round(row["cost"], 4),
                "sim_cost": round(sim["cost"], 4),
                "ratio": row["cost"] / sim["cost"] if sim["cost"] > 0 else math.inf,
                "sim_as_live_start_cost": round(od_start["cost"], 4),
                "ratio_vs_sim_as_live_start": (
                    row["cost"] / od_start["cost"] if od_start["cost"] > 0 else math.inf
                ),
                "sim_as_live_start_met": od_start["met"],
                "sim_trace_past_cost": round(past["cost"], 4),
                "ratio_vs_sim_trace_past": row["cost"] / past["cost"]
                if past["cost"] > 0
                else math.inf,
                "sim_trace_past_met": past["met"],
                "live_met": row["met"],
                "sim_met": sim["met"],
                "live_status": row["status"],
                "live_spot_h": round(row["spot_h"], 3),
                "live_on_demand_h": round(row["od_h"], 3),
                "live_plan_market": row["plan_market"],
                "live_first_start_h": (
                    round(row["first_start_h"], 3) if row["first_start_h"] is not None else None
                ),
                "live_attempts": row["attempts"],
            }
        )
    print(
        f"\n{'job':28} {'trace':40} {'live $':>8} {'sim $':>8} {'ratio':>6} "
        f"{'live met':>8} {'sim met':>7} | {'sim*$':>8} {'ratio*':>6} | {'past$':>8} "
        f"{'ratio':>6}  "
        "live: admission plan, first start (h), attempts"
    )
    for r in rows:
        first = r["live_first_start_h"]
        print(
            f"{r['job']:28} {r['trace']:40} {r['live_cost']:8.3f} {r['sim_cost']:8.3f} "
            f"{r['ratio']:6.3f} {r['live_met']!s:>8} {r['sim_met']!s:>7} | "
            f"{r['sim_as_live_start_cost']:8.3f} {r['ratio_vs_sim_as_live_start']:6.3f} | "
            f"{r['sim_trace_past_cost']:8.3f} {r['ratio_vs_sim_trace_past']:6.3f}  "
            f"{r['live_plan_market']}, {'-' if first is None else f'{first:.2f}'}, "
            f"{r['live_attempts']}"
        )
    print(
        "sim*: the simulator starting each job on the market its live admission plan took; "
        "past: the simulator knowing the trace's past before the start (bench/policies.py's "
        "footing) instead of what the live broker knew"
    )
    figures = summary(rows)
    as_live = against(rows, "ratio_vs_sim_as_live_start", "sim_as_live_start_met")
    figures["vs_sim_as_live_start"] = {k: v for k, v in as_live.items() if k != "jobs"}
    with_past = against(rows, "ratio_vs_sim_trace_past", "sim_trace_past_met")
    figures["vs_sim_trace_past"] = {k: v for k, v in with_past.items() if k != "jobs"}
    print(
        f"median live/sim {figures['median_ratio']:.3f} (goal within {GOAL_MEDIAN:.0%}); "
        f"max |ratio-1| {figures['max_abs_ratio_minus_1']:.3f} (goal <= {GOAL_MAX:.0%}); "
        f"deadline outcomes agree {figures['outcomes_agree']}/{figures['jobs']}; "
        f"goal {'met' if figures['goal_met'] else 'NOT met'}"
    )
    print(
        f"against sim*: median {as_live['median_ratio']:.3f}; max |ratio-1| "
        f"{as_live['max_abs_ratio_minus_1']:.3f}; outcomes agree {as_live['outcomes_agree']}"
        f"/{as_live['jobs']}"
    )
    print(
        f"against the simulator knowing the trace's past: median {with_past['median_ratio']:.3f}; "
        f"max |ratio-1| {with_past['max_abs_ratio_minus_1']:.3f}; outcomes agree "
        f"{with_past['outcomes_agree']}/{with_past['jobs']}"
    )
    print(
        f"live run: {run['wall_seconds']} s wall; control loop lag p50/p90 "
        f"{run['loop_lag_p50_s']}/{run['loop_lag_p90_s']} broker s; data in {run['data_dir']}"
    )
    print(
        json.dumps(
            {
                "bench": "live_vs_sim",
                "seed": args.seed,
                "scale": args.scale,
                **figures,
                **run,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
