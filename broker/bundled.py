"""Reference data shipped with the broker: the Gavel throughput table and the model fitted on it.

The pure core takes measurements as arguments; this module is where they are read from disk.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from broker.core.gpu_specs import Measurements
from broker.core.throughput import ThroughputModel

GAVEL_CSV = Path(__file__).with_name("data") / "gavel-isolated.csv"


@cache
def bundled_measurements() -> Measurements:
    """The Gavel table shipped in ``broker/data/gavel-isolated.csv``."""
    return Measurements.from_csv(GAVEL_CSV.read_text(encoding="utf-8"))


@cache
def bundled_throughput_model() -> ThroughputModel:
    """The throughput model fitted on the bundled measurements (built once)."""
    return ThroughputModel(bundled_measurements())
