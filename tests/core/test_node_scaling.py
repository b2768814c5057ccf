"""Speed across nodes: efficiencies fitted on Gavel's spread runs, read against the CSV."""

from __future__ import annotations

import csv
import math
from collections import defaultdict

import numpy as np
import pytest

from broker.bundled import GAVEL_CSV, bundled_measurements
from broker.core.node_scaling import (
    DEFAULT,
    EXTRA_DOUBLING,
    MAX_NODES,
    fit_efficiency,
    gang_key,
    parse_gang_key,
)

FITTED = fit_efficiency(bundled_measurements())
SCALING_MODELS = ("LM", "ResNet-18", "ResNet-50", "Transformer")  # spread rows at 2-8 GPUs


def _csv_ratios() -> dict[str, dict[int, float]]:
    """Per model and GPU count, the geometric mean over batch sizes of spread / one-server
    rate on the V100, straight from the CSV."""
    rates: dict[tuple[str, str, str, int], float] = {}
    for r in csv.DictReader(GAVEL_CSV.read_text().splitlines()):
        if r["gpu"] == "v100":
            value = float(r["iters_per_s_measured"] or r["iters_per_s_simulation_table"])
            rates[(r["consolidated"], r["model"], r["batch_size"], int(r["num_gpus"]))] = value
    logs: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (kind, model, batch, n), spread in rates.items():
        together = rates.get(("true", model, batch, n))
        if kind == "false" and n > 1 and together and spread > 0:
            logs[model][n].append(math.log(spread / together))
    return {m: {n: math.exp(sum(v) / len(v)) for n, v in by_n.items()} for m, by_n in logs.items()}


def test_the_fitted_efficiency_at_two_nodes_is_the_data_s_and_orders_models_as_it_does() -> None:
    data = _csv_ratios()
    assert set(data) == set(SCALING_MODELS)
    for model in SCALING_MODELS:
        assert FITTED[model][2] == pytest.approx(min(data[model][2], 1.0), rel=1e-9)
    by_data = sorted(SCALING_MODELS, key=lambda m: data[m][2])
    by_fit = sorted(SCALING_MODELS, key=lambda m: FITTED[m][2])
    assert by_fit == by_data
    # What the bundled table says on the V100 (the lead's rough reading was ResNet-50 ~1,
    # Transformer and ResNet-18 ~0.7, LM ~0.5: closer to the slower P100's figures).
    assert by_fit == ["LM", "ResNet-18", "Transformer", "ResNet-50"]
    assert FITTED["ResNet-50"][2] > 0.8 and FITTED["LM"][2] < 0.3


def test_efficiency_never_rises_with_nodes_and_never_beats_the_data() -> None:
    data = _csv_ratios()
    for model, curve in FITTED.items():
        assert curve[0] == curve[1] == 1.0
        assert np.all(np.diff(curve[1:]) <= 1e-12), model
        assert np.all((curve > 0) & (curve <= 1.0))
        for n, ratio in data.get(model, {}).items():
            assert curve[n] <= min(ratio, 1.0) + 1e-12, (model, n)


def test_past_the_measured_nodes_each_doubling_keeps_at_most_ninety_percent() -> None:
    for model in SCALING_MODELS:
        curve = FITTED[model]
        assert curve[16] <= curve[8] * EXTRA_DOUBLING + 1e-12
    assert len(FITTED["ResNet-50"]) == MAX_NODES + 1


def test_a_model_measured_on_one_gpu_does_not_speed_up_across_nodes() -> None:
    for model in ("A3C", "CycleGAN", "Recommendation"):
        nodes = np.arange(1, MAX_NODES + 1)
        assert FITTED[model][1:] * nodes == pytest.approx(np.ones(MAX_NODES))


def test_the_default_is_the_geometric_mean_of_the_scaling_models() -> None:
    for n in (2, 3, 4, 8, 16):
        mean = math.exp(sum(math.log(FITTED[m][n]) for m in SCALING_MODELS) / 4)
        assert FITTED[DEFAULT][n] == pytest.approx(mean)
        assert min(FITTED[m][n] for m in SCALING_MODELS) < FITTED[DEFAULT][n]
    assert 0.45 < FITTED[DEFAULT][2] < 0.55 and 0.3 < FITTED[DEFAULT][8] < 0.4


def test_gang_keys_round_trip_and_a_gpu_alone_is_its_own_key() -> None:
    assert gang_key("H100", 1) == "H100" and parse_gang_key("H100") == ("H100", 1)
    assert gang_key("A100-80GB", 4) == "A100-80GB x4 nodes"
    assert parse_gang_key(gang_key("A100-80GB", 4)) == ("A100-80GB", 4)
    assert len(gang_key("Radeon Pro V520", MAX_NODES)) <= 40  # the column's width
