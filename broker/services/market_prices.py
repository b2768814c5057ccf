"""Stored market prices: the history every process plans on, and the prices the API lists.

A refresh appends what the clouds' pricing APIs said (``store``); the newest row per
(provider, zone, instance type, gpu, market) is the current price. The highest row id is
the version a process compares (``version``, one indexed ``max``) before it loads only the
rows it has not seen (``latest``). ``prune`` drops old history but never a current price.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import Select, delete, func, insert, text
from sqlmodel import Session, col, select

from broker.core.errors import InvalidInput
from broker.core.offers import BUNDLED, OfferTable, PriceObservation
from broker.db.engine import is_postgres
from broker.db.models import PriceRecord

MARKETS = ("spot", "on_demand")
_KEY = (
    col(PriceRecord.provider),
    col(PriceRecord.zone),
    col(PriceRecord.instance_type),
    col(PriceRecord.gpu),
    col(PriceRecord.market),
)


def store(session: Session, observations: list[PriceObservation]) -> int:
    """Append ``observations`` (one bulk insert; the caller commits); rows added.

    On PostgreSQL the table is locked against other writers until the commit, so row ids
    become visible in id order and a reader that saw id N never misses a row below N.
    (SQLite write transactions are serialized already.)
    """
    if not observations:
        return 0
    if is_postgres(session):
        session.execute(text("LOCK TABLE price_observation IN SHARE ROW EXCLUSIVE MODE"))
    rows = [
        {
            "provider": o.provider,
            "region": o.region,
            "zone": o.zone,
            "instance_type": o.instance_type,
            "gpu": o.gpu,
            "market": o.market,
            "micros_per_hour": int(o.micros_per_hour),
            "observed_at": o.observed_at,
            "source": o.source,
        }
        for o in observations
    ]
    session.execute(insert(PriceRecord), rows)
    return len(rows)


def _newest_ids(after_id: int = 0) -> Select:  # type: ignore[type-arg]
    """The id of the newest row per key among rows with id > ``after_id`` (a subquery)."""
    return select(func.max(PriceRecord.id)).where(col(PriceRecord.id) > after_id).group_by(*_KEY)


def prune(session: Session, before: datetime) -> int:
    """Delete rows observed before ``before``, except the newest row of each key (the
    current price stays); rows deleted. The caller commits."""
    keep = _newest_ids().scalar_subquery()
    result = session.execute(
        delete(PriceRecord).where(
            col(PriceRecord.observed_at) < before, col(PriceRecord.id).not_in(keep)
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def latest(session: Session, after_id: int = 0) -> tuple[list[PriceObservation], int]:
    """The newest row per key among rows with id > ``after_id``, and the highest id seen
    (``after_id`` when there is none): the version these rows bring a table to."""
    rows = session.exec(
        select(PriceRecord)
        .where(col(PriceRecord.id).in_(_newest_ids(after_id).scalar_subquery()))
        .order_by(col(PriceRecord.id))
    ).all()
    observations = [
        PriceObservation(
            provider=r.provider,
            region=r.region,
            zone=r.zone,
            instance_type=r.instance_type,
            market=r.market,
            micros_per_hour=int(r.micros_per_hour),
            observed_at=r.observed_at,
            source=r.source,
            gpu=r.gpu,
        )
        for r in rows
    ]
    seen = max((int(r.id or 0) for r in rows), default=after_id)
    return observations, max(seen, after_id)


def version(session: Session) -> int:
    """The stored prices' version: the highest row id (0 when none are stored)."""
    return int(session.exec(select(func.max(PriceRecord.id))).one() or 0)


@dataclass(frozen=True)
class PriceRow:
    """One offer's current price on one market, where it came from and when it was seen
    (``observed_at`` None: the bundled snapshot)."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: str
    micros_per_hour: int
    observed_at: datetime | None
    source: str


def _check(column: np.ndarray, wanted: str | None, field: str, label: str) -> np.ndarray | None:
    """A mask of rows whose ``column`` equals ``wanted`` (case-insensitive), or None for no
    filter; InvalidInput naming the query field and the known values when none does."""
    if wanted is None:
        return None
    known = sorted(set(column.tolist()))
    match = {k.lower(): k for k in known}.get(wanted.strip().lower())
    if match is None:
        raise InvalidInput(
            f"no offer has {field}={wanted!r}; {label}: {', '.join(known) or 'none'}",
            field,
            "query",
        )
    return np.asarray(column == match)


def price_rows(
    offers: OfferTable,
    *,
    gpu: str | None = None,
    provider: str | None = None,
    region: str | None = None,
    market: str | None = None,
) -> list[PriceRow]:
    """The offers' current prices (one row per offered market), filtered, cheapest first
    per GPU type and count. Filters are case-insensitive; InvalidInput (field, known values)
    for a value no offer has, or a market other than spot or on_demand."""
    if market is not None and market not in MARKETS:
        raise InvalidInput(
            f"market must be one of {', '.join(MARKETS)} (got {market!r})", "market", "query"
        )
    mask = np.ones(len(offers), dtype=bool)
    for column, wanted, field, label in (
        (offers.gpu, gpu, "gpu", "known GPUs"),
        (offers.provider, provider, "provider", "providers"),
        (offers.region, region, "region", "regions"),
    ):
        found = _check(column, wanted, field, label)
        if found is not None:
            mask &= found
    table = offers.take(np.flatnonzero(mask))
    rows: list[PriceRow] = []
    for offer in table.offers():
        for name in MARKETS if market is None else (market,):
            price, at, source = (
                (offer.spot_micros_per_hour, offer.spot_as_of, offer.spot_source)
                if name == "spot"
                else (
                    offer.on_demand_micros_per_hour,
                    offer.on_demand_as_of,
                    offer.on_demand_source,
                )
            )
            if price < 0:  # NO_PRICE: not offered on this market
                continue
            rows.append(
                PriceRow(
                    provider=offer.provider,
                    region=offer.region,
                    zone=offer.zone,
                    instance_type=offer.instance_type,
                    gpu=offer.gpu,
                    gpu_count=offer.gpu_count,
                    market=name,
                    micros_per_hour=price,
                    observed_at=at,
                    source=source or BUNDLED,
                )
            )
    rows.sort(key=lambda r: (r.gpu, r.gpu_count, r.micros_per_hour, r.provider, r.zone, r.market))
    return rows
