"""Published GPU specs, and how measured training rates are scaled to unmeasured GPUs by them.

Spec figures are per GPU as clouds count them (a K80 board is two GPUs), dense only:
NVIDIA's "with sparsity" numbers are halved back. Per model, one-GPU speed is fitted as
``intercept[config] + w * log(fp32_tflops) + (1 - w) * log(mem_bandwidth)``, and
multi-GPU speedups are borrowed from the newest measured GPU.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GpuSpec:
    """Peak figures of one GPU: FP32 and FP16 tensor TFLOPs, memory GB/s and GB."""

    fp32_tflops: float
    fp16_tensor_tflops: float
    mem_bandwidth_gbps: float
    mem_gb: float
    cuda: bool = True


GPU_SPECS: dict[str, GpuSpec] = {
    # NVIDIA Tesla K80 datasheet: board 8.73 TF FP32 (boost), 480 GB/s, 24 GB over two
    # GK210 GPUs; halved. No fast FP16.
    "K80": GpuSpec(4.37, 4.37, 240.0, 12.0),
    # NVIDIA Tesla P100 PCIe datasheet (16 GB, the cloud variant): 9.3 / 18.7 TF, 732 GB/s.
    "P100": GpuSpec(9.3, 18.7, 732.0, 16.0),
    # NVIDIA Tesla V100 datasheet, SXM2 (AWS p3, GCP): 15.7 TF FP32, 125 TF tensor, 900 GB/s.
    "V100": GpuSpec(15.7, 125.0, 900.0, 16.0),
    # Same datasheet, V100 SXM2 32 GB (AWS p3dn).
    "V100-32GB": GpuSpec(15.7, 125.0, 900.0, 32.0),
    # NVIDIA T4 datasheet: 8.1 TF FP32, 65 TF FP16 mixed precision, 320 GB/s, 16 GB.
    "T4": GpuSpec(8.1, 65.0, 320.0, 16.0),
    # AWS g5g (Graviton2 + T4G): the same T4 silicon, so the T4 figures.
    "T4g": GpuSpec(8.1, 65.0, 320.0, 16.0),
    # NVIDIA publishes no A10G sheet; Baseten's "NVIDIA A10 vs A10G" spec table (from AWS):
    # 35 TF FP32, 70 TF tensor, 600 GB/s, 24 GB (A10 datasheet: 31.2 / 125 TF, 600 GB/s).
    "A10G": GpuSpec(35.0, 70.0, 600.0, 24.0),
    # NVIDIA L4 datasheet: 30.3 TF FP32, 242 TF FP16 with sparsity, 300 GB/s, 24 GB.
    "L4": GpuSpec(30.3, 121.0, 300.0, 24.0),
    # NVIDIA L40S datasheet: 91.6 TF FP32, 733 TF FP16 with sparsity, 864 GB/s, 48 GB.
    "L40S": GpuSpec(91.6, 366.0, 864.0, 48.0),
    # NVIDIA A100 datasheet, 40 GB SXM4: 19.5 TF FP32, 312 TF FP16 tensor, 1555 GB/s.
    "A100": GpuSpec(19.5, 312.0, 1555.0, 40.0),
    # Same datasheet, 80 GB SXM4: 2039 GB/s.
    "A100-80GB": GpuSpec(19.5, 312.0, 2039.0, 80.0),
    # NVIDIA H100 datasheet, SXM5 (AWS p5, GCP a3): 67 TF FP32, 1979 TF FP16 sparse,
    # 3.35 TB/s, 80 GB.
    "H100": GpuSpec(67.0, 989.5, 3350.0, 80.0),
    # NVIDIA H200 datasheet, SXM: H100 compute, 4.8 TB/s, 141 GB.
    "H200": GpuSpec(67.0, 989.5, 4800.0, 141.0),
    # NVIDIA Tesla P4 datasheet: 5.5 TF FP32 (no fast FP16), 192 GB/s, 8 GB.
    "P4": GpuSpec(5.5, 5.5, 192.0, 8.0),
    # AMD Radeon Pro V520 product page (AWS g4ad): 7.4 TF FP32, 14.7 TF FP16, 512 GB/s HBM2,
    # 8 GB. Not CUDA: the CUDA training models do not run on it.
    "Radeon Pro V520": GpuSpec(7.4, 14.7, 512.0, 8.0, cuda=False),
}

# Names in the Gavel measurements -> catalog names.
MEASURED_GPUS: dict[str, str] = {"k80": "K80", "p100": "P100", "v100": "V100"}
SCALING_SOURCES = ("V100", "P100", "K80")  # multi-GPU speedups come from the first present
MAX_GPU_COUNT = 64


@dataclass(frozen=True)
class Measurements:
    """Measured iterations/s: ``rates[config, gpu, count]``, NaN where not measured.

    ``spread`` holds the same configs' rates with the GPUs spread over servers (Gavel's
    ``consolidated=false`` rows), NaN where not measured; None when not given.
    """

    configs: tuple[tuple[str, int | None], ...]
    gpus: tuple[str, ...]
    counts: tuple[int, ...]
    rates: np.ndarray
    spread: np.ndarray | None = None

    @classmethod
    def from_csv(cls, text: str) -> Measurements:
        """Parse the Gavel CSV: consolidated rows as ``rates``, the others as ``spread``
        (configs, GPUs and counts are the consolidated rows'); prefers the measured column."""
        every = list(csv.DictReader(io.StringIO(text)))
        rows = [r for r in every if r["consolidated"] == "true"]
        keys = {_config(r) for r in rows}
        configs = tuple(sorted(keys, key=lambda k: (k[0], k[1] or 0)))
        gpus = tuple(MEASURED_GPUS[g] for g in sorted({r["gpu"] for r in rows}))
        counts = tuple(sorted({int(r["num_gpus"]) for r in rows}))
        rates = np.full((len(configs), len(gpus), len(counts)), np.nan)
        spread = np.full_like(rates, np.nan)
        for r in every:
            gpu, count = MEASURED_GPUS.get(r["gpu"]), int(r["num_gpus"])
            if _config(r) not in keys or gpu not in gpus or count not in counts:
                continue
            value = r["iters_per_s_measured"] or r["iters_per_s_simulation_table"]
            table = rates if r["consolidated"] == "true" else spread
            table[configs.index(_config(r)), gpus.index(gpu), counts.index(count)] = float(value)
        return cls(configs, gpus, counts, rates, spread)


def _config(row: dict[str, str]) -> tuple[str, int | None]:
    return row["model"], int(row["batch_size"]) if row["batch_size"] else None


def _log_features(specs: Sequence[GpuSpec]) -> tuple[np.ndarray, np.ndarray]:
    compute = np.log([s.fp32_tflops for s in specs])
    bandwidth = np.log([s.mem_bandwidth_gbps for s in specs])
    return compute, bandwidth


def fit_compute_weights(
    data: Measurements, fit_gpus: Sequence[int]
) -> tuple[dict[str, float], np.ndarray]:
    """Least-squares compute weight w per model and intercept per config, on 1-GPU rates.

    log(rate) = intercept[config] + w * log(tflops) + (1 - w) * log(bandwidth), w clipped to [0, 1].
    """
    rate1 = data.rates[:, list(fit_gpus), 0]
    valid = rate1 > 0
    x, y = _log_features([GPU_SPECS[data.gpus[i]] for i in fit_gpus])
    z = np.log(np.where(valid, rate1, 1.0)) - y
    d = np.broadcast_to(x - y, z.shape)
    n = np.maximum(valid.sum(axis=1), 1)
    z_mean = (z * valid).sum(axis=1) / n
    d_mean = (d * valid).sum(axis=1) / n
    z_dev = (z - z_mean[:, None]) * valid
    d_dev = (d - d_mean[:, None]) * valid
    weights: dict[str, float] = {}
    w_of_config = np.empty(len(data.configs))
    for model in sorted({m for m, _ in data.configs}):
        rows = np.array([m == model for m, _ in data.configs])
        den = float((d_dev[rows] ** 2).sum())
        w = float((z_dev[rows] * d_dev[rows]).sum()) / den if den > 0 else 0.5
        weights[model] = min(max(w, 0.0), 1.0)
        w_of_config[rows] = weights[model]
    intercept = np.where(valid.any(axis=1), z_mean - w_of_config * d_mean, np.nan)
    return weights, intercept


def speedup_curves(data: Measurements, gpu: int) -> np.ndarray:
    """Speedup over one GPU at counts 0..MAX_GPU_COUNT per config, linear in log-log.

    Past the largest measured count the last segment's slope (clipped to [0, 1]) goes on;
    a model measured on one GPU only does not speed up.
    """
    grid = np.log2(np.arange(1, MAX_GPU_COUNT + 1))
    curves = np.zeros((len(data.configs), MAX_GPU_COUNT + 1))
    curves[:, 1] = 1.0
    for c in range(len(data.configs)):
        rates = data.rates[c, gpu]
        ok = rates > 0
        if not ok[0]:
            continue
        lx = np.log2(np.array(data.counts)[ok])
        ly = np.log(rates[ok] / rates[0])
        slope = np.clip((ly[-1] - ly[-2]) / (lx[-1] - lx[-2]), 0, 1) if len(lx) > 1 else 0.0
        log_speedup = np.interp(grid, lx, ly) + slope * np.maximum(grid - lx[-1], 0)
        curves[c, 1:] = np.exp(log_speedup)
    return curves


def estimate_rates(data: Measurements, fit_gpus: Sequence[int], spec: GpuSpec) -> np.ndarray:
    """Rates [config, count] of an unmeasured GPU from its specs and the ``fit_gpus``."""
    weights, intercept = fit_compute_weights(data, fit_gpus)
    w = np.array([weights[m] for m, _ in data.configs])
    x, y = _log_features([spec])
    rate1 = np.nan_to_num(np.exp(intercept + y[0] + w * (x[0] - y[0])))
    # A batch that ran out of memory on a measured GPU is assumed not to fit in as much or less.
    failed = data.rates[:, list(fit_gpus), 0] == 0
    fit_mem = np.array([GPU_SPECS[data.gpus[i]].mem_gb for i in fit_gpus])
    rate1[(failed * fit_mem).max(axis=1, initial=0.0) >= spec.mem_gb] = 0.0
    present = [data.gpus.index(g) for g in SCALING_SOURCES if g in data.gpus]
    source = next(i for i in present if i in fit_gpus)
    # Measured dips with more GPUs are noise of one cluster; never carry them over.
    speedup = np.maximum.accumulate(speedup_curves(data, source), axis=1)
    return rate1[:, None] * speedup


def leave_one_gpu_out_error(data: Measurements, held_out: str = "V100") -> dict[str, float]:
    """Refit without one measured GPU and predict its measured rows.

    Returns the median and max absolute relative error over all rows and over 1-GPU rows.
    """
    h = data.gpus.index(held_out)
    predicted = estimate_rates(
        data, [i for i in range(len(data.gpus)) if i != h], GPU_SPECS[held_out]
    )
    truth = data.rates[:, h, :]
    ok = truth > 0  # a batch that did not fit (0) is not a speed to predict
    errors = np.abs(predicted[:, list(data.counts)] / np.where(ok, truth, 1.0) - 1.0)
    single = errors[:, 0][ok[:, 0]]
    return {
        "median": float(np.median(errors[ok])),
        "max": float(errors[ok].max()),
        "rows": float(ok.sum()),
        "median_1gpu": float(np.median(single)),
        "max_1gpu": float(single.max()),
    }
