"""Offers as columns: one numpy array per field, one row per (offer, zone).

Money is integer micro-dollars per instance-hour; a price of -1 (``NO_PRICE``) means that
market is not offered (no spot market, or no published on-demand price). Each market's price
carries when it was observed (NaT for the bundled snapshot, whose capture time is unknown)
and where it came from (``BUNDLED`` or a pricing API); :func:`overlay` lays stored
observations over a table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

import numpy as np

NO_PRICE = NO_SPOT = -1
NOT_AT = np.datetime64("NaT", "s")  # bundled snapshots carry no capture time
BUNDLED = "bundled"  # price source of the snapshot shipped with the package

_STR_FIELDS = ("provider", "region", "zone", "instance_type", "gpu")
_INT_FIELDS = ("gpu_count", "on_demand_micros_per_hour", "spot_micros_per_hour")
_FLOAT_FIELDS = ("gpu_memory_gb", "vcpus", "ram_gb", "spot_risk")
# The columns a catalog gives; price times and sources default to the bundled snapshot's.
CATALOG_FIELDS = (*_STR_FIELDS, *_INT_FIELDS, *_FLOAT_FIELDS)
_TIME_FIELDS = ("on_demand_as_of", "spot_as_of")
_SOURCE_FIELDS = ("on_demand_source", "spot_source")


@dataclass(frozen=True)
class Offer:
    """One rentable shape in one zone, with its hourly prices."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float
    vcpus: float
    ram_gb: float
    on_demand_micros_per_hour: int
    spot_micros_per_hour: int
    spot_risk: float
    on_demand_as_of: datetime | None = None  # None: from the bundled snapshot
    spot_as_of: datetime | None = None
    on_demand_source: str = BUNDLED
    spot_source: str = BUNDLED

    @property
    def has_spot(self) -> bool:
        return self.spot_micros_per_hour >= 0

    @property
    def has_on_demand(self) -> bool:
        return self.on_demand_micros_per_hour >= 0


@dataclass(frozen=True, eq=False)
class OfferTable:
    """Equal-length arrays, one per :class:`Offer` field (strings as numpy unicode arrays)."""

    provider: np.ndarray
    region: np.ndarray
    zone: np.ndarray
    instance_type: np.ndarray
    gpu: np.ndarray
    gpu_count: np.ndarray  # int64
    gpu_memory_gb: np.ndarray  # float64, per GPU
    vcpus: np.ndarray
    ram_gb: np.ndarray
    on_demand_micros_per_hour: np.ndarray  # int64, NO_PRICE where absent
    spot_micros_per_hour: np.ndarray  # int64, NO_PRICE where absent
    spot_risk: np.ndarray  # float64, preemptions per hour on spot
    on_demand_as_of: np.ndarray  # datetime64[s], NaT for the bundled snapshot
    spot_as_of: np.ndarray  # datetime64[s]
    on_demand_source: np.ndarray  # str: BUNDLED or the pricing API that said it
    spot_source: np.ndarray  # str

    def __post_init__(self) -> None:
        lengths = {f.name: len(getattr(self, f.name)) for f in fields(self)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"OfferTable columns differ in length: {lengths}")

    def __len__(self) -> int:
        return len(self.provider)

    def row(self, i: int) -> Offer:
        """Row ``i`` as an :class:`Offer` of plain Python values."""
        return Offer(
            provider=str(self.provider[i]),
            region=str(self.region[i]),
            zone=str(self.zone[i]),
            instance_type=str(self.instance_type[i]),
            gpu=str(self.gpu[i]),
            gpu_count=int(self.gpu_count[i]),
            gpu_memory_gb=float(self.gpu_memory_gb[i]),
            vcpus=float(self.vcpus[i]),
            ram_gb=float(self.ram_gb[i]),
            on_demand_micros_per_hour=int(self.on_demand_micros_per_hour[i]),
            spot_micros_per_hour=int(self.spot_micros_per_hour[i]),
            spot_risk=float(self.spot_risk[i]),
            on_demand_as_of=_to_datetime(self.on_demand_as_of[i]),
            spot_as_of=_to_datetime(self.spot_as_of[i]),
            on_demand_source=str(self.on_demand_source[i]),
            spot_source=str(self.spot_source[i]),
        )

    def offers(self) -> list[Offer]:
        """Every row as an :class:`Offer`."""
        return [self.row(i) for i in range(len(self))]

    def take(self, index: np.ndarray) -> OfferTable:
        """The rows selected by an index array or a boolean mask."""
        return OfferTable(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def replace(self, **columns: np.ndarray) -> OfferTable:
        """A copy with some columns swapped for new arrays of the same length."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        return OfferTable(**(current | columns))

    @classmethod
    def concat(cls, *tables: OfferTable) -> OfferTable:
        """Rows of all ``tables`` in order."""
        return cls(
            **{f.name: np.concatenate([getattr(t, f.name) for t in tables]) for f in fields(cls)}
        )

    @classmethod
    def from_offers(cls, offers: list[Offer]) -> OfferTable:
        """Build a table from :class:`Offer` rows (tests and small hand-made catalogs)."""
        columns = {f.name: [getattr(o, f.name) for o in offers] for f in fields(Offer)}
        for name in _TIME_FIELDS:
            columns[name] = [_to_datetime64(getattr(o, name)) for o in offers]
        return cls.from_columns(columns)

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> OfferTable:
        """Build a table from lists, converting each to its column dtype; absent price times
        and sources are those of the bundled snapshot (NaT, ``BUNDLED``)."""
        arrays = {name: np.asarray(columns[name], dtype=np.str_) for name in _STR_FIELDS}
        arrays |= {name: np.asarray(columns[name], dtype=np.int64) for name in _INT_FIELDS}
        arrays |= {name: np.asarray(columns[name], dtype=np.float64) for name in _FLOAT_FIELDS}
        n = len(arrays["provider"])
        for name in _TIME_FIELDS:
            given = columns.get(name)
            arrays[name] = (
                np.full(n, NOT_AT) if given is None else np.asarray(given, dtype="datetime64[s]")
            )
        for name in _SOURCE_FIELDS:
            given = columns.get(name)
            arrays[name] = np.asarray([BUNDLED] * n if given is None else given, dtype=np.str_)
        for name in (*_STR_FIELDS, *_SOURCE_FIELDS):  # np.asarray([]) is float; keep typed
            if n == 0:
                arrays[name] = np.zeros(0, dtype="<U1")
        return cls(**arrays)


def _to_datetime(value: np.datetime64) -> datetime | None:
    if np.isnat(value):
        return None
    return datetime.fromtimestamp(int(value.astype("datetime64[s]").astype(np.int64)), UTC)


def _to_datetime64(value: datetime | None) -> np.datetime64:
    return NOT_AT if value is None else np.datetime64(int(value.timestamp()), "s")


def empty_table() -> OfferTable:
    """A table with no rows."""
    return OfferTable.from_columns({name: [] for name in CATALOG_FIELDS})


@dataclass(frozen=True)
class PriceObservation:
    """One price a cloud's pricing API gave for one (instance type, zone, market).

    ``micros_per_hour`` is ``NO_PRICE`` when the cloud no longer offers that market there.
    ``zone`` is the zone the catalog uses (AWS zone id such as ``use1-az2``, GCP zone name).
    ``gpu`` names the catalog GPU where the instance type alone does not (a GCP N1 host
    takes T4, V100, P100 or P4); empty: every row of that instance type in that zone.
    """

    provider: str
    region: str
    zone: str
    instance_type: str
    market: str  # "spot" | "on_demand"
    micros_per_hour: int
    observed_at: datetime
    source: str  # e.g. "aws-pricing", "aws-spot-history", "gcp-cloud-billing"
    gpu: str = ""


def overlay(table: OfferTable, observations: Iterable[PriceObservation]) -> OfferTable:
    """``table`` with each observed price (and its time and source) laid over its rows;
    for several observations of one row and market, the newest (latest ``observed_at``,
    then last given) wins. Observations of rows the table lacks are ignored."""
    keys = zip(
        table.provider.tolist(), table.zone.tolist(), table.instance_type.tolist(), strict=True
    )
    index: dict[tuple[str, str, str], list[int]] = {}
    for i, key in enumerate(keys):
        index.setdefault(key, []).append(i)
    price = {
        "on_demand": table.on_demand_micros_per_hour.copy(),
        "spot": table.spot_micros_per_hour.copy(),
    }
    as_of = {"on_demand": table.on_demand_as_of.copy(), "spot": table.spot_as_of.copy()}
    source = {
        "on_demand": table.on_demand_source.astype(object),
        "spot": table.spot_source.astype(object),
    }
    for obs in observations:
        if obs.market not in price:
            continue
        when = _to_datetime64(obs.observed_at)
        for i in index.get((obs.provider, obs.zone, obs.instance_type), ()):
            current = as_of[obs.market][i]
            if (obs.gpu and obs.gpu != table.gpu[i]) or (not np.isnat(current) and when < current):
                continue
            price[obs.market][i] = obs.micros_per_hour
            as_of[obs.market][i] = when
            source[obs.market][i] = obs.source
    return table.replace(
        on_demand_micros_per_hour=price["on_demand"],
        spot_micros_per_hour=price["spot"],
        on_demand_as_of=as_of["on_demand"],
        spot_as_of=as_of["spot"],
        on_demand_source=np.asarray(source["on_demand"].tolist() or [], dtype=np.str_),
        spot_source=np.asarray(source["spot"].tolist() or [], dtype=np.str_),
    )
