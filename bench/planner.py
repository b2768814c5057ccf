"""Planner speed on the full catalog: numpy ranking vs a pure-Python loop over Offer objects.

Builds the bundled catalog (timed, cold), draws N varied job specs, and for each one times
``rank_plans`` (the numpy core), ``quote`` (throughput model + core) and a straightforward
Python loop computing the same ranking, asserting that both give the same plans. Prints
figures, then a JSON line last.

    python bench/planner.py [--specs 1000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from broker.bundled import bundled_throughput_model
from broker.core.node_scaling import MAX_NODES
from broker.core.offers import Offer, OfferTable
from broker.core.planner import SPOT_WINDOWS, PlanRequest, PlanSet, plan_nodes, rank_plans
from broker.core.throughput import ThroughputModel, Workload
from broker.services.job_spec import JobSpec
from broker.services.quoting import Planning, plan_request
from pricing.aws_catalog import load_aws_csv
from pricing.catalog import bundled_catalog
from pricing.gcp_catalog import load_gcp_offers
from pricing.spot_prior import prior_rates

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STARTUP = 0.1


def catalog_load_ms() -> dict[str, float]:
    """Cold build of every piece of the bundled catalog, in milliseconds."""
    t0 = time.perf_counter()
    aws = load_aws_csv()
    t1 = time.perf_counter()
    gcp = load_gcp_offers()
    t2 = time.perf_counter()
    table = OfferTable.concat(aws, gcp)
    t3 = time.perf_counter()
    table.replace(spot_risk=prior_rates(table))
    t4 = time.perf_counter()
    return {
        "aws_ms": (t1 - t0) * 1e3,
        "gcp_ms": (t2 - t1) * 1e3,
        "join_ms": (t3 - t2) * 1e3,
        "spot_risk_ms": (t4 - t3) * 1e3,
        "total_ms": (t4 - t0) * 1e3,
    }


def random_spec(rng: random.Random, models: list[str]) -> JobSpec:
    """A job spec drawn over the shapes, filters and markets users submit."""
    if rng.random() < 0.5:
        workload = {"reference_gpu_hours": rng.uniform(0.5, 400), "reference_gpu": "V100"}
    else:
        workload = {"model": rng.choice(models), "steps": rng.randint(1_000, 2_000_000)}
    resources: dict = {"gpus": rng.choice((1, 1, 1, 2, 4, 8))}
    if rng.random() < 0.4:
        gpus = ["V100", "T4", "A10G", "L4", "A100", "A100-80GB", "H100", "L40S", "P100"]
        resources["gpu_types"] = rng.sample(gpus, rng.randint(1, 4))
    if rng.random() < 0.3:
        resources["min_gpu_memory_gb"] = rng.choice((16, 24, 40, 80))
    if rng.random() < 0.3:
        resources["providers"] = [rng.choice(("aws", "gcp"))]
    if rng.random() < 0.3:
        regions = ["us-east-1", "us-west-2", "eu-west-1", "us-central1", "europe-west4"]
        resources["regions"] = rng.sample(regions, rng.randint(1, 3))
    if rng.random() < 0.2:
        resources["vcpus_per_gpu"] = rng.choice((4, 8))
    if rng.random() < 0.2:
        resources["ram_gb_per_gpu"] = rng.choice((16, 32))
    return JobSpec.model_validate(
        {
            "name": "bench",
            "workload": workload,
            "resources": resources,
            "deadline": (NOW + timedelta(hours=rng.uniform(1, 240))).isoformat(),
            "max_cost": f"{rng.uniform(5, 20_000):.2f}",
            "market": rng.choice(("auto", "auto", "spot", "on_demand")),
            "checkpoint": {
                "interval_minutes": rng.choice((10, 30, 60)),
                "size_gb": rng.choice((0, 5, 50)),
            },
        }
    )


def work_per_hour(
    spec: JobSpec, request: PlanRequest, table: OfferTable, model: ThroughputModel
) -> np.ndarray:
    """Each row's rate for the plan it serves (a gang's whole, for a gang)."""
    workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
    per = table.gpu_count
    nodes = plan_nodes(request, table)
    return model.work_per_hour(
        workload, table.gpu, per, table.vcpus / per, table.ram_gb / per, nodes=nodes
    )


# The pure-Python reference: one Offer at a time, the same formulas as broker.core.planner.


def _filters(r: PlanRequest, o: Offer) -> bool:
    return (
        (r.gpu_types is None or o.gpu in r.gpu_types)
        and (r.providers is None or o.provider in r.providers)
        and (r.regions is None or o.region in r.regions)
        and (r.min_gpu_memory_gb is None or o.gpu_memory_gb >= r.min_gpu_memory_gb)
        and (r.vcpus_per_gpu is None or o.vcpus >= r.vcpus_per_gpu * o.gpu_count)
        and (r.ram_gb_per_gpu is None or o.ram_gb >= r.ram_gb_per_gpu * o.gpu_count)
    )


def _nodes(r: PlanRequest, offers: list[Offer]) -> list[int]:
    """Machines per plan of each offer (0: none): ``broker.core.gangs``' rule, one at a time."""
    eligible = [_filters(r, o) for o in offers]
    largest = max((o.gpu_count for o, ok in zip(offers, eligible, strict=True) if ok), default=0)
    found = []
    for o, ok in zip(offers, eligible, strict=True):
        if not ok:
            found.append(0)
        elif r.nodes is not None or r.gpus <= largest:
            found.append((r.nodes or 1) if o.gpu_count == r.gpus else 0)
        else:
            split, left = divmod(r.gpus, max(o.gpu_count, 1))
            found.append(split if o.gpu_count > 0 and not left and 2 <= split <= MAX_NODES else 0)
    return found


def _spot_choice(
    r: PlanRequest, o: Offer, n: int, hours: float, lost: float, bound: float = math.inf
) -> tuple | None:
    """(cost, hours, worst, p, window) of the chosen window, or None if none fits; an auto
    plan's worst case and cost are capped by ``bound`` (its policy's budget net). ``n``
    machines: prices and preemption rate ``n x`` the offer's."""
    mu, p_s, p_od = (
        o.spot_risk * n * hours,
        float(o.spot_micros_per_hour) * n,
        float(o.on_demand_micros_per_hour) * n,
    )
    e, prod, cdf, moment, best = math.exp(-mu), 1.0, 0.0, 0.0, None
    windows = set(SPOT_WINDOWS.tolist())
    for j in range(int(SPOT_WINDOWS[-1]) + 1):
        if j > 0:
            prod *= mu / j
        pmf = e * prod
        cdf += pmf
        moment += pmf * j
        if j not in windows:
            continue
        p = min(cdf, 1.0)
        window = hours + j * lost
        on_spot = p * hours + moment * lost + (1.0 - p) * window
        if r.market == "spot":
            cost, worst, spent = p_s * on_spot, math.ceil(p_s * window), on_spot
            ok = p >= r.min_spot_success and window <= r.deadline_hours
        else:
            fallback = (1.0 - p) * hours
            cost, spent = p_s * on_spot + p_od * fallback, on_spot + fallback
            worst = min(math.ceil(p_s * window + p_od * hours), bound)
            cost = min(cost, worst)
            ok, p = window + hours <= r.deadline_hours, 1.0
        key = (math.ceil(cost), worst)
        if ok and worst <= r.max_cost_micros and (best is None or key < best[0]):
            best = (key, spent, worst, p, window)
    return best


def reference_rank(r: PlanRequest, offers: list[Offer], rates: list[float]) -> list[tuple]:
    """(offer, market, expected cost, hours, worst case, p_deadline) ranked like the planner."""
    c, ckpt = (
        r.checkpoint_interval_hours,
        r.checkpoint_size_gb * r.checkpoint_seconds_per_gb / 3600.0,
    )
    found = []
    cheapest: tuple[int, float] | None = None  # (cost, hours) of the cheapest on-time od run
    nodes = _nodes(r, offers)
    for i, o in enumerate(offers):
        if not nodes[i] or rates[i] <= 0 or o.on_demand_micros_per_hour < 0:
            continue
        compute = r.total_work / rates[i]
        hours = STARTUP + compute + compute / c * ckpt
        cost = math.ceil(float(o.on_demand_micros_per_hour) * nodes[i] * hours)
        if hours <= r.deadline_hours and (cheapest is None or cost < cheapest[0]):
            cheapest = (cost, hours)
    bound = math.inf
    if cheapest is not None:
        od_cost, od_hours = cheapest
        needed = od_cost / od_hours * (od_hours + r.tick_hours)
        bound = math.ceil(max(needed, 1.5 * od_cost))
    for i, o in enumerate(offers):
        if not nodes[i] or rates[i] <= 0:
            continue
        compute = r.total_work / rates[i]
        hours = STARTUP + compute + compute / c * ckpt
        lost = c / 2.0 + STARTUP + ckpt
        if r.market != "spot" and o.on_demand_micros_per_hour >= 0:
            cost = math.ceil(float(o.on_demand_micros_per_hour) * nodes[i] * hours)
            if hours <= r.deadline_hours and cost <= r.max_cost_micros:
                found.append((cost, hours, i, 0, cost, 1.0))
        spot_ok = o.spot_micros_per_hour >= 0 and (
            r.market == "spot" or o.on_demand_micros_per_hour >= 0
        )
        if r.market != "on_demand" and spot_ok:
            auto_bound = bound if r.market == "auto" else math.inf
            best = _spot_choice(r, o, nodes[i], hours, lost, auto_bound)
            if best is not None:
                found.append((best[0][0], best[1], i, 1, best[2], best[3]))
    found.sort(key=lambda f: f[:4])
    return [(f[2], f[3], f[0], f[1], f[4], f[5]) for f in found[: r.top_n]]


def same(fast: PlanSet, slow: list[tuple]) -> bool:
    """Same offers and markets in the same order; figures equal up to float rounding."""
    if len(fast.plans) != len(slow):
        return False
    for p, (i, g, cost, hours, worst, prob) in zip(fast.plans, slow, strict=True):
        if (p.offer_index, p.market == "spot") != (i, bool(g)):
            return False
        if abs(p.expected_cost_micros - cost) > 1 or abs(p.worst_case_cost_micros - worst) > 1:
            return False
        if not math.isclose(p.expected_hours, hours, rel_tol=1e-12):
            return False
        if not math.isclose(p.p_deadline, prob, rel_tol=1e-12, abs_tol=1e-15):
            return False
    return True


def percentiles(samples: list[float]) -> tuple[float, float]:
    ms = np.array(samples) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--specs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    load = catalog_load_ms()
    table, model = bundled_catalog(), bundled_throughput_model()
    offers = table.offers()
    rng = random.Random(args.seed)
    specs = [random_spec(rng, model.known_models()) for _ in range(args.specs)]
    jobs = []
    for spec in specs:
        total = Workload.from_mapping(spec.workload.model_dump(exclude_none=True)).total_work
        request = plan_request(spec, NOW, total)
        jobs.append((spec, request, work_per_hour(spec, request, table, model)))

    planning = Planning(table, model, startup_hours=STARTUP)
    for spec, req, rates in jobs[:20]:  # warm-up
        rank_plans(req, table, rates)
        planning.quote(spec, NOW)
    core, full, slow, mismatches, with_plans = [], [], [], 0, 0
    for spec, req, rates in jobs:
        t0 = time.perf_counter()
        fast = rank_plans(req, table, rates, STARTUP)
        t1 = time.perf_counter()
        planning.quote(spec, NOW)
        t2 = time.perf_counter()
        reference = reference_rank(req, offers, rates.tolist())
        t3 = time.perf_counter()
        core.append(t1 - t0)
        full.append(t2 - t1)
        slow.append(t3 - t2)
        mismatches += not same(fast, reference)
        with_plans += bool(fast.plans)
    assert mismatches == 0, f"{mismatches} specs ranked differently by the reference loop"

    core_p50, core_p99 = percentiles(core)
    full_p50, full_p99 = percentiles(full)
    slow_p50, slow_p99 = percentiles(slow)
    ratio = sum(slow) / sum(core)
    print(
        f"catalog: {len(table)} offers; cold build {load['total_ms']:.1f} ms "
        f"(aws {load['aws_ms']:.1f}, gcp {load['gcp_ms']:.1f}, "
        f"spot risk {load['spot_risk_ms']:.1f}, join {load['join_ms']:.1f})"
    )
    print(f"specs: {len(jobs)} ({with_plans} with at least one plan); reference agrees on all")
    print(
        f"rank_plans (numpy core): p50 {core_p50:.3f} ms  p99 {core_p99:.3f} ms  (goal p99 <= 5 ms)"
    )
    print(f"quote (throughput + core): p50 {full_p50:.3f} ms  p99 {full_p99:.3f} ms")
    print(f"pure-Python loop:        p50 {slow_p50:.3f} ms  p99 {slow_p99:.3f} ms")
    print(
        f"speed ratio (total loop time / total core time): {ratio:.1f}x; "
        f"at p99 {slow_p99 / core_p99:.1f}x"
    )
    print(json.dumps({
        "bench": "planner", "offers": len(table), "specs": len(jobs), "with_plans": with_plans,
        "catalog_load_ms": round(load["total_ms"], 2),
        "core_p50_ms": round(core_p50, 4), "core_p99_ms": round(core_p99, 4),
        "quote_p50_ms": round(full_p50, 4), "quote_p99_ms": round(full_p99, 4),
        "python_p50_ms": round(slow_p50, 4), "python_p99_ms": round(slow_p99, 4),
        "speed_ratio": round(ratio, 2), "p99_ratio": round(slow_p99 / core_p99, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
