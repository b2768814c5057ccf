"""Why no offer matches a request: the first resource filter that leaves nothing, and the
values that would have matched, so an error message says what to change."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from broker.core.gangs import is_gang_request, node_counts
from broker.core.node_scaling import MAX_NODES
from broker.core.offers import OfferTable


class PlanRequest(Protocol):
    """The resource fields of ``broker.core.planner.PlanRequest`` read here."""

    @property
    def gpus(self) -> int: ...

    @property
    def nodes(self) -> int | None: ...

    @property
    def gpu_types(self) -> tuple[str, ...] | None: ...

    @property
    def min_gpu_memory_gb(self) -> float | None: ...

    @property
    def providers(self) -> tuple[str, ...] | None: ...

    @property
    def regions(self) -> tuple[str, ...] | None: ...

    @property
    def vcpus_per_gpu(self) -> float | None: ...

    @property
    def ram_gb_per_gpu(self) -> float | None: ...


Step = tuple[str, object, np.ndarray, Callable[[np.ndarray], str]]


def upper(values: Sequence[str]) -> list[str]:
    """GPU names compare case-insensitively: ``a100`` is ``A100``."""
    return [v.upper() for v in values]


def gpu_mask(offers: OfferTable, gpu_types: Sequence[str]) -> np.ndarray:
    """Offers of any of ``gpu_types``, names compared case-insensitively."""
    if len(offers) == 0:
        return np.zeros(0, dtype=bool)
    return np.isin(np.char.upper(offers.gpu.astype(str)), upper(gpu_types))


def _listed(values: Sequence[object], limit: int = 30) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values) - limit} more)" if len(values) > limit else "")


def _steps(r: PlanRequest, offers: OfferTable) -> list[Step]:
    """(field, value asked, offers passing, what would match among earlier survivors)."""
    per_gpu = np.maximum(offers.gpu_count, 1)

    def distinct(column: np.ndarray, label: str) -> Callable[[np.ndarray], str]:
        return lambda m: f"{label}: {_listed(sorted(set(column[m].tolist())))}"

    def most(column: np.ndarray, label: str) -> Callable[[np.ndarray], str]:
        return lambda m: label.format(f"{column[m].max():g}")

    steps: list[Step] = []
    if r.gpu_types is not None:
        steps.append(
            (
                "gpu_types",
                list(r.gpu_types),
                gpu_mask(offers, r.gpu_types),
                distinct(offers.gpu, "known GPUs"),
            )
        )
    if r.providers is not None:
        steps.append(
            (
                "providers",
                list(r.providers),
                np.isin(offers.provider, r.providers),
                distinct(offers.provider, "providers offering them"),
            )
        )
    if r.regions is not None:
        steps.append(
            (
                "regions",
                list(r.regions),
                np.isin(offers.region, r.regions),
                distinct(offers.region, "regions offering them"),
            )
        )
    gpu_step = len(steps)
    if r.min_gpu_memory_gb is not None:
        steps.append(
            (
                "min_gpu_memory_gb",
                r.min_gpu_memory_gb,
                offers.gpu_memory_gb >= r.min_gpu_memory_gb,
                most(offers.gpu_memory_gb, "the most memory per GPU is {} GB"),
            )
        )
    if r.vcpus_per_gpu is not None:
        steps.append(
            (
                "vcpus_per_gpu",
                r.vcpus_per_gpu,
                offers.vcpus >= r.vcpus_per_gpu * offers.gpu_count,
                most(offers.vcpus / per_gpu, "the most is {} vCPUs per GPU"),
            )
        )
    if r.ram_gb_per_gpu is not None:
        steps.append(
            (
                "ram_gb_per_gpu",
                r.ram_gb_per_gpu,
                offers.ram_gb >= r.ram_gb_per_gpu * offers.gpu_count,
                most(offers.ram_gb / per_gpu, "the most is {} GB of RAM per GPU"),
            )
        )
    others = np.ones(len(offers), dtype=bool)
    for step in steps:
        others &= step[2]
    counts = node_counts(r.gpus, r.nodes, offers.gpu_count, others)
    label = "GPU counts of one machine"
    if r.nodes is not None and r.nodes > 1:
        label = f"gpus is per machine with nodes={r.nodes}; {label}"
    elif is_gang_request(r.gpus, r.nodes, offers.gpu_count, others):
        label = (
            f"more GPUs than one machine holds run on N identical machines "
            f"(N x GPUs each = {r.gpus}, N <= {MAX_NODES}); {label}"
        )
    steps.insert(gpu_step, ("gpus", r.gpus, counts > 0, distinct(offers.gpu_count, label)))
    return steps


def no_match_message(request: PlanRequest, offers: OfferTable, rated: np.ndarray) -> str:
    """Why no offer fits ``request``: the first filter (in the order a user narrows a
    request) that leaves no offer, with the values that would have matched; or that the
    throughput model cannot rate the job on the GPUs that match (``rated`` is False)."""
    mask = np.ones(len(offers), dtype=bool)
    for field, value, passing, valid in _steps(request, offers):
        narrowed = mask & passing
        if not narrowed.any():
            if not mask.any():
                break
            return f"no offer matches {field}={value!r}; {valid(mask)}"
        mask = narrowed
    else:
        if not (mask & rated).any():
            gpus = _listed(sorted(set(offers.gpu[mask].tolist())))
            return (
                f"the throughput model cannot rate this workload on the GPUs that match "
                f"({gpus}); choose other gpu_types, or give the work as reference_gpu_hours"
            )
    return "no offer matches the resource constraints"
