"""How fast a local instance "trains": the wall seconds one work unit takes on its GPU.

The bundled throughput model predicts work per hour; a fixed per-(model, GPU) factor makes the
local hardware deviate from that prediction as real hardware does, a per-job override slows or
speeds one job on purpose (tests), and the clock scale turns broker hours into wall seconds.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from broker.bundled import bundled_throughput_model
from broker.core.throughput import ThroughputModel, Workload

SPEED_SPREAD = 0.1
_lock = threading.Lock()  # the model fills its caches lazily


def true_speed_factor(model: str, gpu: str, spread: float = SPEED_SPREAD) -> float:
    """A fixed per-(model, GPU) deviation of real speed from the model's prediction."""
    if spread <= 0:
        return 1.0
    seed = int.from_bytes(hashlib.sha256(f"{model}|{gpu}".encode()).digest()[:8], "little")
    return float(np.exp(np.random.default_rng(seed).normal(0.0, spread)))


def work_per_hour(
    workload: Mapping[str, Any],
    gpu: str,
    gpu_count: int,
    *,
    spread: float = SPEED_SPREAD,
    throughput: ThroughputModel | None = None,
) -> float:
    """Work units per broker hour of ``workload`` on ``gpu_count`` x ``gpu`` here.

    Raises ValueError for a workload the model does not accept, an unknown GPU or zero
    throughput.
    """
    parsed = Workload.from_mapping(workload)
    model = throughput or bundled_throughput_model()
    with _lock:
        rate = float(model.work_per_hour(parsed, np.array([gpu]), np.array([gpu_count]))[0])
    if not rate > 0:
        raise ValueError(f"no throughput for this workload on {gpu_count} x {gpu or 'no GPU'}")
    return rate * true_speed_factor(parsed.model or "reference", gpu, spread)


def seconds_per_work_unit(
    workload: Mapping[str, Any],
    gpu: str,
    gpu_count: int,
    *,
    scale: float,
    override: float = 1.0,
    spread: float = SPEED_SPREAD,
    throughput: ThroughputModel | None = None,
) -> float:
    """Wall seconds one work unit takes: 3600 / work per hour / override / clock scale."""
    if not override > 0:
        raise ValueError(f"speed override must be positive, got {override}")
    rate = work_per_hour(workload, gpu, gpu_count, spread=spread, throughput=throughput)
    return 3600.0 / rate / override / scale
