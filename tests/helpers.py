"""Plain helpers shared by tests (importable: tests/ is on pythonpath)."""

from __future__ import annotations


def job_spec(**overrides: object) -> dict:
    """A valid job spec (API.md's example shape) with ``overrides`` applied."""
    spec: dict = {
        "name": "resnet50-imagenet",
        "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 40000},
        "resources": {"gpus": 1, "gpu_types": ["V100", "A100"]},
        "deadline": "2026-12-05T12:00:00Z",
        "max_cost": "250.00",
        "market": "auto",
        "checkpoint": {"interval_minutes": 30, "size_gb": 5},
    }
    spec.update(overrides)
    return spec
