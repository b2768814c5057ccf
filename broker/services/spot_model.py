"""The shared spot model: one row per (provider, zone, instance family) in ``spot_model``,
refitted from the bundled traces (the prior) and the broker's own spot attempts; the planner's
preemption rates (``risk``) and the policy's availability history (``history``) read it.

Prior: the traces of the model's zone and family where there are some, else the fleet (every
trace pooled, fewer runs: ``FLEET_PRIOR_RUNS``); a key with no row yet reads its prior alone.
The traces were taken on p3 (V100) and p2 (K80) instances (``TRACE_FAMILIES``). They name
AWS zones (us-east-1a); the catalog and the attempts use zone ids (use1-az6). Zone names map
to ids per account on real AWS and the traces do not say theirs, so the rule is the local
cloud's: ``TRACE_ZONE_IDS`` is moto's fixed table, under which the market replay
(``providers.local.market``) drives the zone id a trace is matched to by that same trace. On
a real account the zone-level match is a guess within the right region, which the broker's
observations correct.

Observations, read from the attempts of the last ``policy.HISTORY_DAYS`` as the steering
reads them: a spot attempt's running time is an available window, a preemption ends it, a
capacity refusal is a short outage (``REFUSED_OUTAGE_HOURS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

import numpy as np
from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from broker.core import spot_model as core
from broker.core.offers import OfferTable
from broker.core.policy import HISTORY_DAYS, AvailabilityHistory, ZoneHistory
from broker.core.spot_chain import run_lengths
from broker.db.engine import begin_write
from broker.db.models import Attempt, SpotModelRow
from pricing.traces import bundled_traces

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (provider, zone, family)
FLEET = "fleet"
REFUSED_OUTAGE_HOURS = 0.1  # a capacity refusal, as ``steering.spot_history`` reads it
DIGITS = 4  # run lengths are kept to 0.36 s
TRACE_FAMILIES = {"V100": "p3", "K80": "p2"}  # the instances the traces' GPUs ran on
# The zone ids of the zones the traces name, as the local cloud (moto) maps them.
TRACE_ZONE_IDS = {
    "us-east-1a": "use1-az6",
    "us-east-1c": "use1-az2",
    "us-east-1d": "use1-az4",
    "us-east-1f": "use1-az5",
    "us-east-2b": "use2-az2",
    "us-west-2a": "usw2-az2",
    "us-west-2b": "usw2-az1",
    "us-west-2c": "usw2-az3",
}


@dataclass(frozen=True)
class Prior:
    """The runs a model starts from, and the traces they came from."""

    source: str  # FLEET or the trace names, comma-separated
    up: tuple[float, ...]
    down: tuple[float, ...]


def _rounded(runs: Iterable[float]) -> tuple[float, ...]:
    return tuple(round(float(r), DIGITS) for r in runs)


def _prior(names: list[str], ups: list[np.ndarray], downs: list[np.ndarray], n: int) -> Prior:
    return Prior(
        ",".join(names),
        _rounded(core.prior_sample(np.concatenate(ups), n)),
        _rounded(core.prior_sample(np.concatenate(downs), n)),
    )


@cache
def zone_priors() -> dict[Key, Prior]:
    """The prior of each (provider, zone id, family) a bundled trace covers (its traces
    pooled)."""
    pooled: dict[Key, tuple[list[str], list[np.ndarray], list[np.ndarray]]] = {}
    for trace in bundled_traces():
        zone, name = TRACE_ZONE_IDS.get(trace.zone), TRACE_FAMILIES.get(trace.gpu.upper())
        if zone is None or name is None:
            continue
        up, down = run_lengths(trace.available, trace.gap_seconds / 3600.0)
        names, ups, downs = pooled.setdefault(("aws", zone, name), ([], [], []))
        names.append(trace.name)
        ups.append(up)
        downs.append(down)
    return {key: _prior(*runs, core.PRIOR_RUNS) for key, runs in pooled.items()}


@cache
def fleet_prior() -> Prior:
    """Every bundled trace pooled, down-weighted: the prior of a zone with no trace."""
    runs = [run_lengths(t.available, t.gap_seconds / 3600.0) for t in bundled_traces()]
    prior = _prior([], [u for u, _ in runs], [d for _, d in runs], core.FLEET_PRIOR_RUNS)
    return Prior(FLEET, prior.up, prior.down)


def prior_for(key: Key) -> Prior:
    """The prior of one (provider, zone, family)."""
    return zone_priors().get(key) or fleet_prior()


@cache
def prior_stats(prior: Prior) -> core.SpotStats:
    """Rates of a prior alone (a key before its first refit)."""
    return core.spot_stats(core.zone_history(prior.up, prior.down))


def observed(
    session: Session, now: datetime, days: float = HISTORY_DAYS
) -> dict[Key, tuple[ZoneHistory, int]]:
    """What the spot attempts of the last ``days`` saw, per key, and how many were read."""
    attempts = session.exec(
        select(Attempt)
        .where(Attempt.market == "spot", col(Attempt.created_at) >= now - timedelta(days=days))
        .order_by(col(Attempt.created_at), col(Attempt.id))
    ).all()
    seen: dict[Key, AvailabilityHistory] = {}
    counts: dict[Key, int] = {}
    for attempt in attempts:
        zone = attempt.zone
        key = (
            attempt.provider,
            zone,
            core.family(attempt.provider, attempt.instance_type, attempt.gpu),
        )
        history = seen.get(key, AvailabilityHistory())
        if attempt.end_reason == "capacity":
            history = history.observe(zone, False, REFUSED_OUTAGE_HOURS)
        elif attempt.started_at is not None:
            hours = ((attempt.ended_at or now) - attempt.started_at).total_seconds() / 3600
            history = history.observe(zone, True, max(hours, 0.0))
            if attempt.end_reason == "preempted":
                history = history.observe(zone, False, 0.0)
        else:
            continue
        seen[key] = history
        counts[key] = counts.get(key, 0) + 1
    return {key: (history.zones[key[1]], counts[key]) for key, history in seen.items()}


def _offer_keys(offers: OfferTable) -> list[Key]:
    """Each (provider, zone, family) among the offers, sorted."""
    names = core.families(offers).tolist()
    return sorted(set(zip(offers.provider.tolist(), offers.zone.tolist(), names, strict=True)))


def _fit(prior: Prior, seen: ZoneHistory, count: int) -> tuple[ZoneHistory, dict[str, object]]:
    """The model of a key, and its row's fitted-on fields (not yet its rates)."""
    observed_runs = ZoneHistory(
        up_runs=_rounded(seen.up_runs),
        down_runs=_rounded(seen.down_runs),
        last_available=seen.last_available,
        age_hours=round(seen.age_hours, DIGITS),
    )
    model = core.combine(prior.up, prior.down, observed_runs)
    kept_prior = max(len(model.up_runs) - len(observed_runs.up_runs), 0) + max(
        len(model.down_runs) - len(observed_runs.down_runs), 0
    )
    return model, {
        "up_runs": list(model.up_runs),
        "down_runs": list(model.down_runs),
        "last_available": model.last_available,
        "age_hours": model.age_hours,
        "prior": prior.source[:500],
        "prior_runs": kept_prior,
        "observations": count,
    }


def refit(session: Session, now: datetime, offers: OfferTable) -> int:
    """Refit the model of every (provider, zone, family) among ``offers``; returns how many
    rows changed (only those get ``fitted_at = now``). Rows of keys no longer offered stay."""
    seen = observed(session, now)
    existing = {(r.provider, r.zone, r.family): r for r in session.exec(select(SpotModelRow))}
    stats: dict[tuple[tuple[float, ...], tuple[float, ...]], core.SpotStats] = {}
    changes: list[tuple[Key, dict[str, object]]] = []
    for key in _offer_keys(offers):
        history, count = seen.get(key, (ZoneHistory(), 0))
        model, fields = _fit(prior_for(key), history, count)
        row = existing.get(key)
        if row is not None and all(getattr(row, name) == v for name, v in fields.items()):
            continue
        runs = (model.up_runs, model.down_runs)
        if runs not in stats:
            stats[runs] = core.spot_stats(model)
        rates = stats[runs]
        fields |= {
            "preemptions_per_hour": rates.preemptions_per_hour,
            "mean_window_hours": rates.mean_window_hours,
            "mean_outage_hours": rates.mean_outage_hours,
            "fitted_at": now,
        }
        changes.append((key, fields))
    begin_write(session)
    for (provider, zone, name), fields in changes:
        row = existing.get((provider, zone, name))
        if row is None:
            row = SpotModelRow(provider=provider, zone=zone, family=name, prior="", fitted_at=now)
        for field, value in fields.items():
            setattr(row, field, value)
        session.add(row)
    try:
        session.commit()
    except IntegrityError:  # another process inserted a key first; the next refit catches up
        session.rollback()
        log.warning("spot model refit raced another; rows left as they were")
        return 0
    return len(changes)


def _row_history(row: SpotModelRow) -> ZoneHistory:
    return core.zone_history(row.up_runs, row.down_runs, row.last_available, row.age_hours)


def history(session: Session, zones: Iterable[Key]) -> AvailabilityHistory:
    """The policy's ``AvailabilityHistory`` of these (provider, zone, family): one entry per
    zone (so give the zones of one family, as a job's candidate zones are); a key with no
    row gets its prior alone."""
    wanted = list(dict.fromkeys(zones))
    names = sorted({zone for _, zone, _ in wanted})
    rows = session.exec(select(SpotModelRow).where(col(SpotModelRow.zone).in_(names))).all()
    found = {(r.provider, r.zone, r.family): r for r in rows}
    seen: dict[str, ZoneHistory] = {}
    for key in wanted:
        prior = prior_for(key)
        seen[key[1]] = (
            _row_history(found[key]) if key in found else core.zone_history(prior.up, prior.down)
        )
    return AvailabilityHistory(seen)


def risk(session: Session, offers: OfferTable) -> np.ndarray:
    """Preemptions per hour on spot of every offer row (``OfferTable.spot_risk``); an offer
    with no row gets its prior's rate."""
    rows = session.exec(
        select(
            SpotModelRow.provider,
            SpotModelRow.zone,
            SpotModelRow.family,
            SpotModelRow.preemptions_per_hour,
        )
    ).all()
    rates = {(p, z, f): rate for p, z, f, rate in rows}
    if len(offers) == 0:
        return np.zeros(0)
    keys = np.char.add(
        np.char.add(np.char.add(offers.provider, "\x1f"), offers.zone),
        np.char.add("\x1f", core.families(offers)),
    )
    unique, inverse = np.unique(keys, return_inverse=True)
    values = np.array([_rate(rates, _key(str(k))) for k in unique])
    return values[inverse.reshape(-1)]


def _rate(rates: dict[Key, float], key: Key) -> float:
    if key in rates:
        return rates[key]
    return prior_stats(prior_for(key)).preemptions_per_hour


def _key(joined: str) -> Key:
    provider, zone, name = joined.split("\x1f")
    return provider, zone, name


def version(session: Session) -> int:
    """The model's version: the latest ``fitted_at`` (epoch microseconds; 0 before any fit).
    A process compares it to the one it loaded to notice a refit."""
    latest = session.exec(select(func.max(SpotModelRow.fitted_at))).one()
    return 0 if latest is None else int(latest.timestamp() * 1_000_000)
