"""Training speed across nodes: how much of N machines' speed a gang keeps (pure).

``rate(N nodes of g GPUs) = N x rate(g GPUs on one node) x efficiency(model, N)``.

The efficiency of a model at ``n`` nodes is read from Gavel's ``consolidated=false`` rows
(the same job with its GPUs spread over servers): the geometric mean over the model's batch
sizes of ``rate(spread, n GPUs) / rate(one server, n GPUs)`` on the V100, the newest GPU
measured (the one whose multi-GPU speedups the throughput model borrows). Each of Gavel's
spread GPUs is taken as one node: a node's own GPUs reduce over NVLink/PCIe first, so the
network sees one party per node. Made conservative:

- capped at 1 (a spread run measured faster than one server is noise) and never rising with
  more nodes (the lowest figure at any measured count up to ``n``);
- between measured counts, linear in ``log2(N)`` of ``log(efficiency)``;
- past the largest measured count (8), each doubling keeps the last measured doubling's
  factor, at most ``EXTRA_DOUBLING`` (0.9);
- a model measured on one GPU only does not speed up on one machine, so not across machines
  either: ``1/N``;
- a workload without a model (reference GPU-hours) or a model with no spread rows takes the
  geometric mean of the fitted models (``DEFAULT``): about 0.5 at 2-4 nodes and 0.34 at 8,
  below the median model and half of linear scaling, because the work of an unknown program
  is best overestimated (a slow gang must not run past its deadline or its money).

Gavel's servers talked over 10-25 Gb/s Ethernet; cloud gangs in one placement group have
100-3200 Gb/s, but their GPUs are 3-10x faster than a V100, so the network's share of a step
is of the same order. Corrections learnt from a gang's own progress
(``broker.services.calibration``, keyed by ``gang_key``) replace these figures per (model,
GPU, node count).
"""

from __future__ import annotations

import re

import numpy as np

from broker.core.gpu_specs import SCALING_SOURCES, Measurements

MAX_NODES = 16  # the most nodes a gang may have (``resources.nodes``)
SCALING_GPU = "V100"
EXTRA_DOUBLING = 0.9  # the most one doubling of nodes past the measured counts keeps
DEFAULT = "*"  # the efficiency key of workloads without a fitted model

_GANG_KEY = re.compile(r"^(?P<gpu>.+) x(?P<nodes>[0-9]+) nodes$")


def gang_key(gpu: str, nodes: int) -> str:
    """The GPU key of a learnt correction: the GPU itself on one node, ``"H100 x4 nodes"``
    for a gang (its speed across nodes is learnt apart from one machine's)."""
    return gpu if nodes <= 1 else f"{gpu} x{nodes} nodes"


def parse_gang_key(key: str) -> tuple[str, int]:
    """(GPU, nodes) of a correction's GPU key (see ``gang_key``)."""
    match = _GANG_KEY.fullmatch(key)
    return (match["gpu"], int(match["nodes"])) if match else (key, 1)


def _curve(measured: dict[int, float]) -> np.ndarray:
    """Efficiency at 0..MAX_NODES nodes from measured {nodes: ratio} (see the module doc)."""
    counts = sorted(measured)
    logs, low = [], 0.0
    for n in counts:
        low = min(low, float(np.log(min(measured[n], 1.0))))
        logs.append(low)
    x = np.log2(np.arange(1, MAX_NODES + 1))
    known_x = np.log2(np.array([1, *counts], dtype=float))
    known_y = np.array([0.0, *logs])
    curve = np.interp(x, known_x, known_y)
    if len(counts) >= 2:
        step = (known_y[-1] - known_y[-2]) / (known_x[-1] - known_x[-2])
    else:
        step = known_y[-1] / known_x[-1] if known_x[-1] > 0 else 0.0
    step = min(step, float(np.log(EXTRA_DOUBLING)))
    past = x > known_x[-1]
    curve[past] = known_y[-1] + step * (x[past] - known_x[-1])
    return np.concatenate([[1.0], np.exp(curve)])


def fit_efficiency(data: Measurements, gpu: str = SCALING_GPU) -> dict[str, np.ndarray]:
    """Efficiency at 0..MAX_NODES nodes per model of ``data`` (index = node count; 1 at 0
    and 1 node), plus ``DEFAULT`` for workloads without a fitted model. Read on ``gpu``, or
    the first of ``SCALING_SOURCES`` measured when ``data`` lacks it."""
    models = sorted({m for m, _ in data.configs})
    nodes = np.arange(MAX_NODES + 1)
    fitted: dict[str, np.ndarray] = {}
    spread = data.spread if data.spread is not None else np.full_like(data.rates, np.nan)
    present = [g for g in (gpu, *SCALING_SOURCES) if g in data.gpus]
    h = data.gpus.index(present[0]) if present else 0
    counts = np.array(data.counts)
    for model in models:
        rows = np.array([m == model for m, _ in data.configs])
        together = data.rates[rows, h, :]
        apart = spread[rows, h, :]
        if not (together[:, counts > 1] > 0).any():
            fitted[model] = 1.0 / np.maximum(nodes, 1)  # no speedup measured on one machine
            continue
        ok = (together > 0) & (apart > 0) & (counts > 1)[None, :]
        if not ok.any():
            continue  # measured on one machine only: the default applies
        ratio = np.log(np.where(ok, apart, 1.0) / np.where(ok, together, 1.0))
        mean = (ratio * ok).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
        fitted[model] = _curve(
            {int(n): float(np.exp(mean[k])) for k, n in enumerate(counts) if ok[:, k].any()}
        )
    scaling = [
        curve
        for m, curve in fitted.items()
        if not np.array_equal(curve, 1.0 / np.maximum(nodes, 1))
    ]
    default = np.exp(np.mean(np.log(scaling), axis=0)) if scaling else 1.0 / np.maximum(nodes, 1)
    for model in models:
        fitted.setdefault(model, default)
    fitted[DEFAULT] = default
    return fitted
