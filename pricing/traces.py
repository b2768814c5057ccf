"""Spot availability traces (the format of the bundled ``data/spot_traces``).

In these single-node traces a sample of 1 means spot was NOT available at that tick and 0
means it was (see ``data/spot_traces/README.md``); ``Trace.available`` holds the inverse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

_NAME = re.compile(r"^(?P<zone>[a-z0-9-]+?)_(?P<gpu>[a-z0-9]+)_(?P<count>\d+)\.json$")


@dataclass(frozen=True)
class Trace:
    """One zone's spot availability, one boolean sample every ``gap_seconds``."""

    name: str
    zone: str
    gpu: str
    gpu_count: int
    gap_seconds: float
    available: np.ndarray  # bool, True = spot obtainable at that tick

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_seconds / 3600.0

    def available_at(self, seconds_since_start: float) -> bool:
        """Availability at an offset into the trace (wraps around at the end)."""
        index = int(seconds_since_start // self.gap_seconds) % len(self.available)
        return bool(self.available[index])


def load_trace(path: str | Path) -> Trace:
    """Read one trace file ``<zone>_<gpu>_<count>.json``; other names get zone = file stem."""
    path = Path(path)
    payload = json.loads(path.read_text())
    samples = np.asarray(payload["data"], dtype=np.int64)
    gap = float(payload["metadata"]["gap_seconds"])
    match = _NAME.match(path.name)
    zone, gpu, count = (
        (match["zone"], match["gpu"].upper(), int(match["count"])) if match else (path.stem, "", 1)
    )
    return Trace(
        name=f"{path.parent.name}/{path.name}",
        zone=zone,
        gpu=gpu,
        gpu_count=count,
        gap_seconds=gap,
        available=samples == 0,
    )


def bundled_trace_dir() -> Path:
    """Folder of the traces shipped with the package."""
    return Path(str(resources.files("pricing") / "data" / "spot_traces"))


@lru_cache
def bundled_traces() -> tuple[Trace, ...]:
    """Every trace shipped with the package, sorted by name."""
    root = bundled_trace_dir()
    return tuple(load_trace(p) for p in sorted(root.rglob("*.json")))
