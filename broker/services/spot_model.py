"""The shared spot model: one row per (provider, zone, instance family) in ``spot_model``,
refitted from the bundled traces (the prior) and the broker's own spot attempts; the planner's
preemption rates (``risk``) and the policy's availability history (``history``) read it.

The prior (the bundled traces' runs per key, or the fleet's) is ``pricing.spot_prior``'s; the
bundled catalog's offline rates are that prior's too, so a quote reads the same rates with or
without a database until the broker has observations of its own.

Observations, read from the attempts of the last ``policy.HISTORY_DAYS`` as the steering
reads them: a spot attempt's running time is an available window, a preemption ends it, a
capacity refusal is a short outage (``REFUSED_OUTAGE_HOURS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from broker.core import spot_model as core
from broker.core.offers import OfferTable
from broker.core.policy import HISTORY_DAYS, AvailabilityHistory, ZoneHistory, history_of
from broker.db.engine import begin_write
from broker.db.models import Attempt, SpotModelRow
from pricing.spot_prior import (
    DIGITS,
    Key,
    Prior,
    offer_keys,
    prior_for,
    prior_rate,
    rounded,
    split_key,
)

log = logging.getLogger(__name__)

REFUSED_OUTAGE_HOURS = core.REFUSED_OUTAGE_HOURS


def spot_attempts(session: Session, now: datetime, days: float = HISTORY_DAYS) -> list[Any]:
    """The spot attempts created in the last ``days``, oldest first, as rows of the columns
    their sightings need (``core.attempt_sightings``): provider, zone, instance_type, gpu,
    end_reason, started_at, ended_at, nodes. Plain rows: the fleet's view reads thousands."""
    return list(
        session.exec(
            select(
                Attempt.provider,
                Attempt.zone,
                Attempt.instance_type,
                Attempt.gpu,
                Attempt.end_reason,
                Attempt.started_at,
                Attempt.ended_at,
                Attempt.nodes,
            )
            .where(Attempt.market == "spot", col(Attempt.created_at) >= now - timedelta(days=days))
            .order_by(col(Attempt.created_at), col(Attempt.id))
        ).all()
    )


def observed(
    session: Session, now: datetime, days: float = HISTORY_DAYS
) -> dict[Key, tuple[ZoneHistory, int]]:
    """What the spot attempts of the last ``days`` saw, per key, and how many were read."""
    sightings: dict[Key, list[tuple[str, bool, float]]] = {}
    counts: dict[Key, int] = {}
    for provider, zone, instance_type, gpu, end_reason, started, ended, nodes in spot_attempts(
        session, now, days
    ):
        seen = core.attempt_sightings(zone, end_reason, started, ended, now, nodes)
        if not seen:
            continue
        key = (provider, zone, core.family(provider, instance_type, gpu))
        sightings.setdefault(key, []).extend(seen)
        counts[key] = counts.get(key, 0) + 1
    return {key: (history_of(seen).zones[key[1]], counts[key]) for key, seen in sightings.items()}


def _offer_keys(offers: OfferTable) -> list[Key]:
    """Each (provider, zone, family) among the offers, sorted."""
    names = core.families(offers).tolist()
    return sorted(set(zip(offers.provider.tolist(), offers.zone.tolist(), names, strict=True)))


def _fit(prior: Prior, seen: ZoneHistory, count: int) -> tuple[ZoneHistory, dict[str, object]]:
    """The model of a key, and its row's fitted-on fields (not yet its rates)."""
    observed_runs = ZoneHistory(
        up_runs=rounded(seen.up_runs),
        down_runs=rounded(seen.down_runs),
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
    unique, inverse = np.unique(offer_keys(offers), return_inverse=True)
    keys = [split_key(str(k)) for k in unique]
    values = np.array([rates[k] if k in rates else prior_rate(k) for k in keys])
    return values[inverse.reshape(-1)]


def version(session: Session) -> int:
    """The model's version: the latest ``fitted_at`` (epoch microseconds; 0 before any fit).
    A process compares it to the one it loaded to notice a refit."""
    latest = session.exec(select(func.max(SpotModelRow.fitted_at))).one()
    return 0 if latest is None else int(latest.timestamp() * 1_000_000)
