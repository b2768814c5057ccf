"""Training speed of a workload on an offer's GPUs, vectorized over offers.

Measured Gavel rates (K80, P100, V100; one server) are used as they are. Other GPUs are
scaled from published specs: per model, ``speed ~ fp32_tflops**w * mem_bandwidth**(1 - w)``
with the compute weight ``w`` in [0, 1] fitted on the measured GPUs, and multi-GPU scaling
taken from the V100's measured speedups. A starved host (Synergy) and learned per
(model, GPU) correction factors multiply the result. A gang of N such machines runs
``N x efficiency(model, N)`` times one machine's speed (``broker.core.node_scaling``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from broker.core.gpu_specs import (
    GPU_SPECS,
    MAX_GPU_COUNT,
    Measurements,
    estimate_rates,
    leave_one_gpu_out_error,
    speedup_curves,
)
from broker.core.node_scaling import DEFAULT, MAX_NODES, fit_efficiency, parse_gang_key

__all__ = [
    "HostNeeds",
    "ThroughputModel",
    "Workload",
    "leave_one_gpu_out_error",
    "update_correction",
]

DEFAULT_REFERENCE_GPU = "V100"
REFERENCE = "*"  # host-needs key for reference-GPU-hours workloads (model unknown)
MEASURED_ALIASES = {"V100-32GB": "V100"}  # same silicon: the measured rates hold
CORRECTION_RANGE = (0.2, 5.0)
MIN_CORRECTION_WEIGHT = 0.1


@dataclass(frozen=True)
class HostNeeds:
    """vCPUs and RAM GB per GPU a model needs to keep one V100 busy loading data."""

    vcpus_per_gpu: float
    ram_gb_per_gpu: float
    cpu_exponent: float = 1.0
    ram_exponent: float = 0.5


# Why these (Synergy, Mohan et al., OSDI 2022): image models decode and augment JPEGs on
# the CPU and read datasets larger than the page cache, so they starve first; language
# models tokenize once and barely use the host.
DEFAULT_HOST_NEEDS: dict[str, HostNeeds] = {
    "ResNet-18": HostNeeds(8.0, 24.0),
    "ResNet-50": HostNeeds(6.0, 24.0),
    "CycleGAN": HostNeeds(6.0, 8.0),
    "A3C": HostNeeds(4.0, 4.0),  # the game simulators run in CPU worker processes
    "Recommendation": HostNeeds(2.0, 16.0),  # the rating matrix lives in RAM
    "Transformer": HostNeeds(1.0, 8.0),
    "LM": HostNeeds(1.0, 4.0),
    REFERENCE: HostNeeds(4.0, 16.0),
}


def _norm(model: str) -> str:
    return "".join(ch for ch in model.lower() if ch.isalnum())


@dataclass(frozen=True)
class Workload:
    """A job's work: ``steps`` iterations of a known model, or GPU-hours on a reference GPU."""

    model: str | None = None
    batch_size: int | None = None
    steps: float | None = None
    reference_gpu_hours: float | None = None
    reference_gpu: str | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.reference_gpu_hours is None):
            raise ValueError("workload: give either model (with steps) or reference_gpu_hours")
        for name in ("batch_size", "steps", "reference_gpu_hours"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"workload.{name} must be positive, got {value!r}")

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> Workload:
        """Build from the API's JSON shape; unknown keys are an error."""
        unknown = set(spec) - {
            "model",
            "batch_size",
            "steps",
            "reference_gpu_hours",
            "reference_gpu",
        }
        if unknown:
            raise ValueError(f"workload: unknown fields {sorted(unknown)}")
        return cls(**spec)

    @property
    def total_work(self) -> float:
        """Work units to do: steps, or reference GPU-hours."""
        work = self.steps if self.model is not None else self.reference_gpu_hours
        if work is None:
            raise ValueError("workload.steps is required for a model workload")
        return float(work)


def _all_rates(data: Measurements, gpus: Sequence[str]) -> np.ndarray:
    """Rates [config, gpu, count] for every catalog GPU, plus a zero row for unknown GPUs."""
    table = np.zeros((len(data.configs), len(gpus) + 1, MAX_GPU_COUNT + 1))
    everything = range(len(data.gpus))
    for g, name in enumerate(gpus):
        measured = MEASURED_ALIASES.get(name, name)
        if measured in data.gpus:
            h = data.gpus.index(measured)
            rate1 = np.nan_to_num(data.rates[:, h, 0])
            table[:, g] = rate1[:, None] * speedup_curves(data, h)
            for k, count in enumerate(data.counts):
                known = ~np.isnan(data.rates[:, h, k])
                table[known, g, count] = data.rates[known, h, k]
        elif GPU_SPECS[name].cuda:
            table[:, g] = estimate_rates(data, everything, GPU_SPECS[name])
    return table


def _starvation(have: np.ndarray, need: np.ndarray, exponent: float) -> np.ndarray:
    ratio = np.divide(have, need, out=np.ones_like(need), where=need > 0)
    return np.clip(np.where(np.isnan(ratio), 1.0, ratio), 0.0, 1.0) ** exponent


class ThroughputModel:
    """Iterations/s and work/hour of workloads on (GPU type, count, host) offers.

    Host starvation: ``speed *= min(1, vcpus/need_cpu)**cpu_exponent *
    min(1, ram/need_ram)**ram_exponent``, needs from ``host_needs`` scaled by the GPU's
    1-GPU speed relative to a V100 (a faster GPU eats data faster).
    """

    def __init__(
        self, data: Measurements, host_needs: Mapping[str, HostNeeds] | None = None
    ) -> None:
        self._data = data
        self._models = sorted({m for m, _ in data.configs}, key=str.lower)
        self._model_ids = {_norm(m): i for i, m in enumerate(self._models)}
        self._config_model = np.array([self._models.index(m) for m, _ in data.configs])
        self._gpus = list(GPU_SPECS)
        self._unknown = len(self._gpus)
        self._rates = _all_rates(data, self._gpus)
        aliases = {v: i for i, n in enumerate(self._gpus) for v in (n, n.upper(), n.lower())}
        order = sorted(aliases)
        self._alias_names = np.array(order)
        self._alias_ids = np.array([aliases[a] for a in order])
        self._last_lookup: tuple[np.ndarray, np.ndarray] = (np.array([], dtype=str), np.array([]))
        needs = {**DEFAULT_HOST_NEEDS, **(host_needs or {})}
        self._needs = [needs[m] for m in self._models]
        self._reference_needs = needs[REFERENCE]
        self._corrections = np.ones((len(self._models), self._unknown + 1))
        fitted = fit_efficiency(data)
        # Row per model, then the default's row for workloads without a model.
        self._efficiency = np.array([fitted[m] for m in (*self._models, DEFAULT)])
        self._gang_corrections: dict[tuple[int, int, int], float] = {}
        self._tables: dict[tuple[int, int | None], tuple[np.ndarray, np.ndarray]] = {}
        self._reference_tables: dict[int, np.ndarray] = {}

    def known_models(self) -> list[str]:
        """Model names a workload can name (matched case-insensitively)."""
        return list(self._models)

    def known_gpus(self) -> list[str]:
        """Catalog GPU names with an estimate; others (and AMD) always rate 0."""
        return [g for g in self._gpus if GPU_SPECS[g].cuda]

    def efficiency(self, model: str | None, nodes: np.ndarray) -> np.ndarray:
        """Share of ``nodes`` machines' speed a gang of ``model`` keeps (1 on one node;
        ``model`` None: a workload without one). Unknown models raise ValueError."""
        row = len(self._models) if model is None else self._model_index(model)
        n = np.clip(np.asarray(nodes, dtype=np.intp), 0, MAX_NODES)
        return np.asarray(self._efficiency[row, n])

    def with_corrections(self, corrections: Mapping[tuple[str, str], float]) -> ThroughputModel:
        """A copy whose rates are multiplied by ``corrections[(model, gpu)]`` (replacing any).

        A GPU key of a gang (``node_scaling.gang_key``: ``"H100 x4 nodes"``) corrects that
        gang's speed instead, in place of the GPU's own correction. Unknown models raise
        ValueError; unknown GPUs are skipped (they rate 0 anyway).
        """
        other = copy.copy(self)
        other._corrections = np.ones_like(self._corrections)
        other._gang_corrections = {}
        for (model, key), factor in corrections.items():
            if not (factor > 0 and math.isfinite(factor)):
                raise ValueError(f"correction for ({model!r}, {key!r}) must be positive: {factor}")
            gpu, nodes = parse_gang_key(key)
            g = int(self.gpu_ids(np.array([gpu]))[0])
            if g == self._unknown:
                continue
            m = self._model_index(model)
            if nodes > 1:
                other._gang_corrections[(m, g, nodes)] = factor
            else:
                other._corrections[m, g] = factor
        other._tables, other._reference_tables = {}, {}
        return other

    def gpu_ids(self, gpu: np.ndarray) -> np.ndarray:
        """Row of each GPU name (exact, upper or lower case) in the tables; unknown -> zero row.

        Integer arrays are taken as ids already; the last names array is remembered.
        """
        names = np.asarray(gpu)
        if names.dtype.kind in "iu":
            return np.where((names >= 0) & (names < self._unknown), names, self._unknown)
        if names.dtype.kind != "U":
            names = names.astype(str)
        last_names, last_ids = self._last_lookup
        if last_names.shape == names.shape and np.array_equal(last_names, names):
            return last_ids
        pos = np.minimum(np.searchsorted(self._alias_names, names), len(self._alias_names) - 1)
        ids = np.where(self._alias_names[pos] == names, self._alias_ids[pos], self._unknown)
        self._last_lookup = (names.copy(), ids)
        return ids

    def iters_per_second(
        self,
        model: str,
        batch_size: int | None,
        gpu: np.ndarray,
        gpu_count: np.ndarray,
        vcpus_per_gpu: np.ndarray | None = None,
        ram_gb_per_gpu: np.ndarray | None = None,
    ) -> np.ndarray:
        """Training iterations/s of ``model`` on each offer (all its GPUs); 0 where unknown."""
        m = self._model_index(model)
        table, relative = self._table(m, batch_size)
        ids = self.gpu_ids(gpu)
        rate = table[ids, np.clip(np.asarray(gpu_count, dtype=np.intp), 0, MAX_GPU_COUNT)]
        return rate * self._host_factor(
            self._needs[m], relative[ids], vcpus_per_gpu, ram_gb_per_gpu
        )

    def work_per_hour(
        self,
        workload: Workload,
        gpu: np.ndarray,
        gpu_count: np.ndarray,
        vcpus_per_gpu: np.ndarray | None = None,
        ram_gb_per_gpu: np.ndarray | None = None,
        nodes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Work units per wall-clock hour: steps, or reference-GPU-hours (1x reference = 1.0).

        ``gpu_count``, ``vcpus_per_gpu`` and ``ram_gb_per_gpu`` are one machine's; with
        ``nodes``, each row is a gang of that many such machines."""
        rate = self._one_node(workload, gpu, gpu_count, vcpus_per_gpu, ram_gb_per_gpu)
        if nodes is None:
            return rate
        n = np.asarray(nodes)
        if not (n > 1).any():
            return rate
        scale = np.where(n > 1, n * self.efficiency(workload.model, n), 1.0)
        if workload.model is not None and self._gang_corrections:
            m, ids = self._model_index(workload.model), self.gpu_ids(gpu)
            for (model, g, count), factor in self._gang_corrections.items():
                if model == m:
                    # The gang's own correction replaces its GPU's (already in ``rate``).
                    scale = np.where(
                        (ids == g) & (n == count), scale * factor / self._corrections[m, g], scale
                    )
        return rate * scale

    def _one_node(
        self,
        workload: Workload,
        gpu: np.ndarray,
        gpu_count: np.ndarray,
        vcpus_per_gpu: np.ndarray | None,
        ram_gb_per_gpu: np.ndarray | None,
    ) -> np.ndarray:
        if workload.model is not None:
            rate = self.iters_per_second(
                workload.model, workload.batch_size, gpu, gpu_count, vcpus_per_gpu, ram_gb_per_gpu
            )
            return rate * 3600.0
        reference = workload.reference_gpu or DEFAULT_REFERENCE_GPU
        ref = int(self.gpu_ids(np.array([reference]))[0])
        if ref == self._unknown or not GPU_SPECS[self._gpus[ref]].cuda:
            raise ValueError(
                f"unknown reference_gpu {reference!r}; known GPUs: {self.known_gpus()}"
            )
        ids = self.gpu_ids(gpu)
        counts = np.clip(np.asarray(gpu_count, dtype=np.intp), 0, MAX_GPU_COUNT)
        relative = self._reference_table(self._gpus.index("V100"))[ids, 1]
        factor = self._host_factor(self._reference_needs, relative, vcpus_per_gpu, ram_gb_per_gpu)
        return self._reference_table(ref)[ids, counts] * factor

    def _model_index(self, model: str) -> int:
        m = self._model_ids.get(_norm(model))
        if m is None:
            raise ValueError(f"unknown model {model!r}; known models: {', '.join(self._models)}")
        return m

    def _table(self, m: int, batch_size: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Corrected rates [gpu, count] and raw 1-GPU speed relative to V100 [gpu], cached."""
        key = (m, batch_size)
        if key not in self._tables:
            raw = self._raw_rates(m, batch_size)
            v100 = raw[self._gpus.index("V100"), 1]
            relative = raw[:, 1] / v100 if v100 > 0 else np.ones(len(raw))
            self._tables[key] = (raw * self._corrections[m][:, None], relative)
        return self._tables[key]

    def _raw_rates(self, m: int, batch_size: int | None) -> np.ndarray:
        """Rates [gpu, count] at ``batch_size``: log-log between measured batches, else nearest."""
        rows = np.flatnonzero(self._config_model == m)
        batches = [b for r in rows if (b := self._data.configs[r][1]) is not None]
        if len(batches) < len(rows):  # a model without a batch size (A3C, CycleGAN)
            return self._rates[rows[0]]
        if batch_size is None:
            batch_size = batches[(len(batches) - 1) // 2]  # the middle measured batch
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        logs = np.log(np.array(batches, dtype=float))
        i = int(np.searchsorted(logs, math.log(batch_size)))
        if i == 0 or i == len(rows) or logs[i] == math.log(batch_size):
            return self._rates[rows[min(i, len(rows) - 1)]]
        t = (math.log(batch_size) - logs[i - 1]) / (logs[i] - logs[i - 1])
        low, high = self._rates[rows[i - 1]], self._rates[rows[i]]
        fits = (low > 0) & (high > 0)
        mixed = np.log(np.where(fits, low, 1)) * (1 - t) + np.log(np.where(fits, high, 1)) * t
        return np.where(fits, np.exp(mixed), 0.0)

    def _reference_table(self, ref: int) -> np.ndarray:
        """Speed [gpu, count] relative to one ``ref`` GPU: geometric mean over models."""
        if ref not in self._reference_tables:
            rates = self._rates * self._corrections[self._config_model][:, :, None]
            base = rates[:, ref, 1][:, None, None]
            ok = (rates > 0) & (base > 0)
            logs = np.log(np.where(ok, rates, 1.0) / np.where(base > 0, base, 1.0))
            total = np.zeros(rates.shape[1:])
            models = np.zeros(rates.shape[1:])
            for m in range(len(self._models)):
                rows = self._config_model == m
                n = ok[rows].sum(axis=0)
                total += np.where(n > 0, (logs[rows] * ok[rows]).sum(axis=0) / np.maximum(n, 1), 0)
                models += n > 0
            mean = np.divide(total, models, out=np.zeros_like(total), where=models > 0)
            self._reference_tables[ref] = np.where(models > 0, np.exp(mean), 0.0)
        return self._reference_tables[ref]

    @staticmethod
    def _host_factor(
        needs: HostNeeds,
        relative: np.ndarray,
        vcpus_per_gpu: np.ndarray | None,
        ram_gb_per_gpu: np.ndarray | None,
    ) -> np.ndarray | float:
        factor: np.ndarray | float = 1.0
        if vcpus_per_gpu is not None:
            have = np.asarray(vcpus_per_gpu, dtype=float)
            factor = factor * _starvation(have, needs.vcpus_per_gpu * relative, needs.cpu_exponent)
        if ram_gb_per_gpu is not None:
            have = np.asarray(ram_gb_per_gpu, dtype=float)
            factor = factor * _starvation(have, needs.ram_gb_per_gpu * relative, needs.ram_exponent)
        return factor


def update_correction(
    old_factor: float, predicted_rate: float, observed_rate: float, observations: int
) -> float:
    """Fold one observed rate into a (model, GPU) correction: a log-space weighted mean.

    ``predicted_rate`` is the uncorrected prediction; ``observations`` is how many went into
    ``old_factor`` (0: a prior). Weight 1/(observations+1), at least 0.1; ratio and
    result clamped to 0.2-5.
    """
    low, high = CORRECTION_RANGE
    old = min(max(old_factor, low), high) if old_factor > 0 else 1.0
    if not (
        predicted_rate > 0 and observed_rate > 0 and math.isfinite(observed_rate / predicted_rate)
    ):
        return old
    # Clamping the ratio before averaging bounds what one wild report can do.
    ratio = min(max(observed_rate / predicted_rate, low), high)
    weight = max(1.0 / (max(observations, 0) + 1), MIN_CORRECTION_WEIGHT)
    if weight >= 1.0:
        return ratio
    log_factor = (1 - weight) * math.log(old) + weight * math.log(ratio)
    return min(max(math.exp(log_factor), low), high)
