"""Reading the bundled price snapshots: where they are and how their cells become numbers."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

from broker.core.money import to_micros
from broker.core.offers import NO_PRICE

DATA_DIR = Path(__file__).with_name("data")

_MIB = re.compile(r"'SizeInMiB': (\d+)")


def gpu_memory_gb(gpu_info: str) -> float:
    """Per-GPU memory in GB (GiB as clouds report it) from a GpuInfo literal; 0 if absent."""
    match = _MIB.search(gpu_info)
    return int(match.group(1)) / 1024.0 if match else 0.0


def price_micros(text: str) -> int:
    """A CSV dollar price to micro-dollars; empty means no price (:data:`NO_PRICE`)."""
    return to_micros(Decimal(text)) if text else NO_PRICE
