"""Offers as columns: one numpy array per field, one row per (offer, zone).

Money is integer micro-dollars per instance-hour; a price of -1 (``NO_PRICE``) means that
market is not offered (no spot market, or no published on-demand price).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

import numpy as np

NO_PRICE = NO_SPOT = -1
NOT_AT = np.datetime64("NaT", "s")  # bundled snapshots carry no capture time

_STR_FIELDS = ("provider", "region", "zone", "instance_type", "gpu")
_INT_FIELDS = ("gpu_count", "on_demand_micros_per_hour", "spot_micros_per_hour")
_FLOAT_FIELDS = ("gpu_memory_gb", "vcpus", "ram_gb", "spot_risk")


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
    price_as_of: datetime | None = None  # None: from a bundled snapshot

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
    price_as_of: np.ndarray  # datetime64[s], NaT for bundled snapshots

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
            price_as_of=_to_datetime(self.price_as_of[i]),
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
        columns["price_as_of"] = [_to_datetime64(o.price_as_of) for o in offers]
        return cls.from_columns(columns)

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> OfferTable:
        """Build a table from lists, converting each to its column dtype."""
        arrays = {name: np.asarray(columns[name], dtype=np.str_) for name in _STR_FIELDS}
        arrays |= {name: np.asarray(columns[name], dtype=np.int64) for name in _INT_FIELDS}
        arrays |= {name: np.asarray(columns[name], dtype=np.float64) for name in _FLOAT_FIELDS}
        n = len(arrays["provider"])
        as_of = columns.get("price_as_of")
        arrays["price_as_of"] = (
            np.full(n, NOT_AT) if as_of is None else np.asarray(as_of, dtype="datetime64[s]")
        )
        for name in _STR_FIELDS:  # np.asarray([]) is float; keep empty tables typed
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
    return OfferTable.from_columns({f.name: [] for f in fields(Offer) if f.name != "price_as_of"})
