"""Rank plans for a job over the whole offer table at once (pure numpy, no I/O).

Per offer, with work W, rate r (work/hour), startup s, checkpoint interval c, checkpoint
write/restore time t = size_gb * seconds_per_gb / 3600:

- on-demand hours ``H = s + W/r + (W/r)/c * t``; cost ``p_od * H``; sure to finish.
- spot: preemptions ``N ~ Poisson(lambda * H)``; each loses ``L = c/2 + s + t``, so an
  uninterrupted-budget run takes ``T = H + N*L`` (mean ``H + lambda*H*L``). A plan gives
  spot a window ``w_k = H + k*L`` (room for k preemptions), k from ``SPOT_WINDOWS``:

  * market "spot": stop at ``w_k``. Expected cost ``p_s * E[min(T, w_k)]``, worst case
    ``p_s * w_k``, ``p_deadline = P(N <= k)``. k is the smallest window whose
    ``P(N <= k) >= min_spot_success``; the plan needs ``w_k <= deadline``.
  * market "auto": spot for at most ``w_k``, then the whole job again on on-demand of the
    same offer. Worst case ``p_s * w_k + p_od * H`` (slack burnt on spot, then all work on
    on-demand); expected cost ``p_s * E[min(T, w_k)] + P(N > k) * p_od * H``; needs
    ``w_k + H <= deadline``; ``p_deadline = 1``. k minimises the expected cost (in whole
    micro-dollars; the smaller window on a tie).
  * market "spot" with ``policy_fallback`` (an ``auto`` job the policy moves to spot): the
    "auto" figures, but the offer needs only ``H <= deadline``. The policy leaves spot for
    on-demand while the work left still fits (its plan and safety net, measured by the
    simulator), so requiring room for a whole spot run and another whole on-demand run
    would overrule it with a rule the simulator never sees.

Each plan's figures depend on the deadline and budget only through which windows are
allowed, so a tighter deadline or budget can only remove options, never cheapen one.
Plans whose worst case exceeds ``max_cost`` are dropped; the rest rank by expected cost,
then expected hours, then offer row.

A gang plan (``broker.core.gangs``: N identical machines of one offer row, so in one zone)
is that row with prices ``N x`` the machine's, the rate the caller gives for the whole gang
(``ThroughputModel.work_per_hour`` with ``nodes``), preemption rate ``N x`` the machine's
(the gang stops when any node is preempted) and one machine's start-up; the formulas above
then hold as they are, and gang and single-machine plans rank together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np

from broker.core.gangs import node_counts
from broker.core.money import format_usd, usd_text
from broker.core.offers import BUNDLED, OfferTable
from broker.core.reservation import reservation
from broker.core.why_not import gpu_mask, no_match_message

Market = Literal["auto", "spot", "on_demand"]
SPOT_WINDOWS = np.array([0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64])
_J = np.arange(1, SPOT_WINDOWS[-1] + 1, dtype=np.float64)


@dataclass(frozen=True)
class PlanRequest:
    """A job's needs in planner units: hours from now, micro-dollars, work units.

    ``gpus`` is GPUs per machine when ``nodes`` is given, else in all (``broker.core.gangs``
    says how the planner then picks the machines)."""

    gpus: int
    total_work: float
    deadline_hours: float
    max_cost_micros: int
    gpu_types: tuple[str, ...] | None = None
    min_gpu_memory_gb: float | None = None
    providers: tuple[str, ...] | None = None
    regions: tuple[str, ...] | None = None
    vcpus_per_gpu: float | None = None
    ram_gb_per_gpu: float | None = None
    market: Market = "auto"
    checkpoint_interval_hours: float = 0.5
    checkpoint_size_gb: float = 5.0
    checkpoint_seconds_per_gb: float = 10.0
    min_spot_success: float = 0.9
    top_n: int = 20
    tick_hours: float = 0.0  # the control loop's interval: the budget net looks a tick ahead
    nodes: int | None = 1  # machines per plan; None: the planner decides (``gangs``)
    # market "spot" for an ``auto`` job whose policy (``broker.core.policy``) decided spot and
    # keeps its deadline itself, leaving spot for on-demand in time: see the module doc
    policy_fallback: bool = False


@dataclass(frozen=True)
class Plan:
    """An offer run on one market, with its time, cost and deadline odds."""

    offer_index: int
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: Literal["spot", "on_demand"]
    price_per_hour_micros: int
    expected_hours: float
    expected_cost_micros: int
    worst_case_cost_micros: int
    p_deadline: float
    spot_window_hours: float | None = None  # spot time before stopping / falling back
    on_demand_fallback: bool = False
    price_observed_at: datetime | None = None  # None: the bundled snapshot's price
    price_source: str = BUNDLED
    # A gang: ``nodes`` identical instances of the offer in its zone, each with
    # ``gpu_count`` GPUs; ``price_per_hour_micros`` and the costs are the whole gang's.
    nodes: int = 1


@dataclass(frozen=True)
class Infeasible:
    """Why no plan fits, with the figure the API message quotes."""

    reason: Literal["no_matching_offer", "over_budget", "too_slow"]
    message: str
    cheapest_on_time_worst_case_micros: int | None = None
    earliest_finish_hours: float | None = None


@dataclass(frozen=True)
class PlanSet:
    """Ranked plans, the cheapest on-time on-demand plan (ignoring max_cost), and why-not."""

    plans: list[Plan]
    cheapest_on_demand: Plan | None
    infeasible_reason: Infeasible | None


def resource_mask(request: PlanRequest, offers: OfferTable) -> np.ndarray:
    """Offers that serve the request (``plan_nodes`` > 0)."""
    return plan_nodes(request, offers) > 0


def plan_nodes(request: PlanRequest, offers: OfferTable) -> np.ndarray:
    """Machines per plan on each offer row, 0 where the row does not serve the request: one
    with exactly ``gpus`` GPUs, or a gang (``broker.core.gangs.node_counts``), among the
    offers passing every other resource filter given."""
    eligible = _filters(request, offers)
    counts = node_counts(request.gpus, request.nodes, offers.gpu_count, eligible)
    return np.where(eligible, counts, 0)


def _filters(request: PlanRequest, offers: OfferTable) -> np.ndarray:
    """Offers passing every resource filter but the GPU count."""
    mask = np.ones(len(offers), dtype=bool)
    if request.gpu_types is not None:
        mask &= gpu_mask(offers, request.gpu_types)
    if request.providers is not None:
        mask &= np.isin(offers.provider, request.providers)
    if request.regions is not None:
        mask &= np.isin(offers.region, request.regions)
    if request.min_gpu_memory_gb is not None:
        mask &= offers.gpu_memory_gb >= request.min_gpu_memory_gb
    if request.vcpus_per_gpu is not None:
        mask &= offers.vcpus >= request.vcpus_per_gpu * offers.gpu_count
    if request.ram_gb_per_gpu is not None:
        mask &= offers.ram_gb >= request.ram_gb_per_gpu * offers.gpu_count
    return mask


def _poisson_tables(mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(N <= k) and sum_{j<=k} j P(N = j) at every k of SPOT_WINDOWS, per row of ``mu``."""
    # mu = risk * hours repeats across zones and regions: compute each distinct value once.
    unique, inverse = np.unique(mu, return_inverse=True)
    steps = np.concatenate([np.ones((len(unique), 1)), unique[:, None] / _J[None, :]], axis=1)
    pmf = np.exp(-unique)[:, None] * np.cumprod(steps, axis=1)
    cdf = np.minimum(np.cumsum(pmf, axis=1), 1.0)
    first_moment = np.cumsum(pmf * np.arange(pmf.shape[1]), axis=1)
    inverse = inverse.reshape(-1)
    return cdf[:, SPOT_WINDOWS][inverse], first_moment[:, SPOT_WINDOWS][inverse]


def _ceil_micros(x: np.ndarray) -> np.ndarray:
    return np.ceil(x).astype(np.int64)


@dataclass
class _Candidates:
    index: np.ndarray
    spot: bool
    hours: np.ndarray
    cost: np.ndarray
    worst: np.ndarray
    p: np.ndarray
    window: np.ndarray
    feasible: np.ndarray  # deadline (and success odds) only; max_cost applied later


def _on_demand(
    idx: np.ndarray, hours: np.ndarray, price: np.ndarray, deadline: float
) -> _Candidates:
    cost = _ceil_micros(price * hours)
    ones = np.ones(len(idx))
    return _Candidates(idx, False, hours, cost, cost, ones, ones * np.nan, hours <= deadline)


def _spot(
    request: PlanRequest,
    idx: np.ndarray,
    hours: np.ndarray,
    lost: np.ndarray,
    p_spot: np.ndarray,
    p_od: np.ndarray,
    risk: np.ndarray,
    bound: float = math.inf,
) -> _Candidates:
    """Spot (market "spot") or spot-then-on-demand (market "auto"), one window per offer.

    ``bound``: what an ``auto`` job can spend at most whatever the window
    (``broker.core.reservation``: the budget net keeps it there), capping its worst case."""
    cdf, moment = _poisson_tables(risk * hours)
    window = hours[:, None] + SPOT_WINDOWS[None, :] * lost[:, None]
    on_spot = cdf * hours[:, None] + moment * lost[:, None] + (1.0 - cdf) * window
    if request.market == "spot" and not request.policy_fallback:
        cost = p_spot[:, None] * on_spot
        worst = _ceil_micros(p_spot[:, None] * window)
        expected_hours = on_spot
        on_time = (cdf >= request.min_spot_success) & (window <= request.deadline_hours)
    else:
        fallback = (1.0 - cdf) * hours[:, None]
        cost = p_spot[:, None] * on_spot + p_od[:, None] * fallback
        loose = _ceil_micros(p_spot[:, None] * window + p_od[:, None] * hours[:, None])
        worst = np.minimum(loose, bound) if math.isfinite(bound) else loose
        cost = np.minimum(cost, worst)  # the net caps every outcome, so their mean too
        expected_hours = on_spot + fallback
        if request.policy_fallback:
            on_time = np.broadcast_to(hours[:, None] <= request.deadline_hours, window.shape)
        else:
            on_time = window + hours[:, None] <= request.deadline_hours
    fits = on_time & (worst <= request.max_cost_micros)
    # The cheapest window (in whole micro-dollars) within budget, the smallest such window
    # on ties so the worst case is no larger than needed; with none within budget, the
    # on-time window with the smallest worst case, which the infeasibility message quotes.
    cost_micros = _ceil_micros(np.where(fits, cost, 0.0))
    cheapest = np.where(fits, cost_micros, np.iinfo(np.int64).max).min(axis=1)
    best = fits & (cost_micros == cheapest[:, None])
    k = np.where(
        fits.any(axis=1),
        np.argmax(best, axis=1),
        np.argmin(np.where(on_time, worst, np.iinfo(np.int64).max), axis=1),
    )
    rows = np.arange(len(idx))
    p = (
        cdf[rows, k]
        if request.market == "spot" and not request.policy_fallback
        else np.ones(len(idx))
    )
    return _Candidates(
        idx,
        True,
        expected_hours[rows, k],
        _ceil_micros(cost[rows, k]),
        worst[rows, k],
        p,
        window[rows, k],
        on_time.any(axis=1),
    )


def _plan(offers: OfferTable, nodes: np.ndarray, c: _Candidates, i: int, fallback: bool) -> Plan:
    o = int(c.index[i])
    price = offers.spot_micros_per_hour[o] if c.spot else offers.on_demand_micros_per_hour[o]
    n = int(nodes[o])
    row = offers.row(o)
    return Plan(
        offer_index=o,
        provider=str(offers.provider[o]),
        region=str(offers.region[o]),
        zone=str(offers.zone[o]),
        instance_type=str(offers.instance_type[o]),
        gpu=str(offers.gpu[o]),
        gpu_count=int(offers.gpu_count[o]),
        market="spot" if c.spot else "on_demand",
        price_per_hour_micros=int(price) * n,
        expected_hours=float(c.hours[i]),
        expected_cost_micros=int(c.cost[i]),
        worst_case_cost_micros=int(c.worst[i]),
        p_deadline=float(c.p[i]),
        spot_window_hours=float(c.window[i]) if c.spot else None,
        on_demand_fallback=fallback,
        price_observed_at=row.spot_as_of if c.spot else row.on_demand_as_of,
        price_source=row.spot_source if c.spot else row.on_demand_source,
        nodes=n,
    )


def _auto_bound(request: PlanRequest, od: _Candidates) -> float:
    """The most an ``auto`` job may spend on any plan (``broker.core.reservation``), priced
    on the cheapest on-time on-demand plan it would fall back to; inf when none is on time."""
    if not od.feasible.any():
        return math.inf
    k = int(np.argmin(np.where(od.feasible, od.cost, np.iinfo(np.int64).max)))
    hours = float(od.hours[k])
    price = float(od.cost[k]) / hours if hours > 0 else 0.0
    bound = reservation(
        "auto",
        on_demand_price=price,
        work_hours=hours,
        restart_hours=0.0,  # od.hours includes the start-up
        tick_hours=request.tick_hours,
        max_cost=math.inf,
        on_demand_only=float(od.cost[k]),
    )
    return float(math.ceil(bound))


def _ranked(groups: list[_Candidates], keep: list[np.ndarray], n: int) -> list[tuple[int, int]]:
    """(group, position) of the best ``n`` kept candidates: cost, hours, offer, market."""
    g = np.concatenate([np.full(int(m.sum()), j) for j, m in enumerate(keep)])
    pos = np.concatenate([np.flatnonzero(m) for m in keep])
    cost = np.concatenate([c.cost[m] for c, m in zip(groups, keep, strict=True)])
    hours = np.concatenate([c.hours[m] for c, m in zip(groups, keep, strict=True)])
    offer = np.concatenate([c.index[m] for c, m in zip(groups, keep, strict=True)])
    order = np.lexsort((g, offer, hours, cost))[:n]
    return [(int(g[i]), int(pos[i])) for i in order]


def rank_plans(
    request: PlanRequest, offers: OfferTable, work_per_hour: np.ndarray, startup_hours: float = 0.1
) -> PlanSet:
    """Feasible plans ranked by expected cost (see the module docstring for the model).

    ``work_per_hour``: each offer row's rate for the plan it serves (a gang's for a gang)."""
    nodes = plan_nodes(request, offers)
    idx = np.flatnonzero((nodes > 0) & (work_per_hour > 0))
    n = nodes[idx]
    c_int = request.checkpoint_interval_hours
    ckpt = request.checkpoint_size_gb * request.checkpoint_seconds_per_gb / 3600.0
    compute = request.total_work / work_per_hour[idx]
    hours = startup_hours + compute + compute / c_int * ckpt
    lost = np.full(len(idx), c_int / 2.0 + startup_hours + ckpt)
    # Whole-gang prices; a missing price (negative) stays negative.
    p_od = offers.on_demand_micros_per_hour[idx].astype(np.float64) * n
    p_spot = offers.spot_micros_per_hour[idx].astype(np.float64) * n
    max_cost = request.max_cost_micros

    o = p_od >= 0  # rows with no published price have no plan on that market
    od = _on_demand(idx[o], hours[o], p_od[o], request.deadline_hours)
    groups, keep = [od], [od.feasible & (od.worst <= max_cost) & (request.market != "spot")]
    if request.market != "on_demand":
        by_auto = request.market == "auto" or request.policy_fallback
        s = (p_spot >= 0) & (o if by_auto else True)
        bound = _auto_bound(request, od) if by_auto else math.inf
        risk = offers.spot_risk[idx[s]] * n[s]  # a gang stops when any node is preempted
        sp = _spot(request, idx[s], hours[s], lost[s], p_spot[s], p_od[s], risk, bound)
        groups.append(sp)
        keep.append(sp.feasible & (sp.worst <= max_cost))
    fallback = request.market == "auto" or request.policy_fallback
    plans = [
        _plan(offers, nodes, groups[g], i, fallback and g == 1)
        for g, i in _ranked(groups, keep, request.top_n)
    ]
    best_od = _ranked([od], [od.feasible], 1)
    cheapest_od = _plan(offers, nodes, od, best_od[0][1], False) if best_od else None
    allowed = groups[1:] if request.market == "spot" else groups
    why = None
    if not plans:
        rated = work_per_hour > 0
        why = _explain(allowed, hours, max_cost) if len(idx) else _no_match(request, offers, rated)
    return PlanSet(plans, cheapest_od, why)


def _no_match(request: PlanRequest, offers: OfferTable, rated: np.ndarray) -> Infeasible:
    return Infeasible("no_matching_offer", no_match_message(request, offers, rated))


def _explain(groups: list[_Candidates], hours: np.ndarray, max_cost: int) -> Infeasible:
    worst = np.concatenate([c.worst[c.feasible] for c in groups])
    if len(worst):
        cheapest = int(worst.min())
        return Infeasible(
            "over_budget",
            f"no plan meets the deadline within max_cost (${format_usd(max_cost)}); the "
            f"cheapest on-time plan has a worst case of {usd_text(cheapest)}: raise "
            f"max_cost to at least {usd_text(cheapest)}, or move the deadline later",
            cheapest_on_time_worst_case_micros=cheapest,
        )
    earliest = float(hours.min())
    return Infeasible(
        "too_slow",
        f"no plan meets the deadline; the earliest possible finish is {earliest:.2f} h",
        earliest_finish_hours=earliest,
    )
