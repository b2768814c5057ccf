"""Compute Engine SKUs of the Cloud Billing Catalog API, and GCP offer prices composed from them.

A GPU VM's price is the sum of SKUs, as the bundled catalog composes it
(``pricing/gcp_catalog.py``): the machine family's vCPU ("Core") and memory ("Ram", per GiB)
SKUs for the host, plus the GPU SKU (per GPU) times the GPU count. Each SKU is per usage
type: "OnDemand" (on-demand) or "Preemptible" (spot). SKUs are told apart by description,
as GCP writes them::

    N1 Predefined Instance Core running in Americas                   (OnDemand)
    Spot Preemptible A2 Instance Ram running in EMEA                   (Preemptible)
    Nvidia Tesla T4 GPU running in Americas                            (OnDemand)
    Nvidia L4 GPU attached to Spot Preemptible VMs running in APAC     (Preemptible)

Anything else (commitments, custom and sole-tenant shapes, virtual workstation and DWS GPU
SKUs) does not match and is ignored. Prices are kept in nano-dollars, as the API gives them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

COMPUTE_SERVICE = "services/6F81-5844-456A"  # Compute Engine's service in the catalog
NANOS_PER_MICRO = 1000

USAGE_TYPES = {"on_demand": "OnDemand", "spot": "Preemptible"}
_MARKETS = {usage: market for market, usage in USAGE_TYPES.items()}

# Machine family (machine type prefix) -> how its Core/Ram SKUs name it.
FAMILY_SKU_NAMES = {"n1": "N1 Predefined", "a2": "A2", "a3": "A3", "g2": "G2"}
# Source accelerator name (pricing.gcp_catalog) -> how its GPU SKU names it.
GPU_SKU_NAMES = {
    "T4": "Nvidia Tesla T4",
    "V100": "Nvidia Tesla V100",
    "P100": "Nvidia Tesla P100",
    "P4": "Nvidia Tesla P4",
    "A100": "Nvidia Tesla A100",
    "A100-80GB": "Nvidia Tesla A100 80GB",
    "H100": "Nvidia H100 80GB",
    "H100-MEGA": "Nvidia H100 80GB Mega",
    "H200": "Nvidia H200 141GB",
    "L4": "Nvidia L4",
}
# GPU models as descriptions spell them (some SKUs drop "Nvidia"/"Tesla"; A3 Mega has three).
_GPU_MODELS = {
    **{n.removeprefix("Nvidia ").removeprefix("Tesla "): gpu for gpu, n in GPU_SKU_NAMES.items()},
    "H100 Mega 80GB": "H100-MEGA",
    "H100 80GB Plus": "H100-MEGA",
}
_FAMILIES = {name: family for family, name in FAMILY_SKU_NAMES.items()}
_GPU_SKU = re.compile(
    r"^(?:Nvidia )?(?:Tesla )?(?P<model>.+?) GPU "
    r"(?P<spot>attached to Spot Preemptible VMs )?running in "
)
_HOST_SKU = re.compile(
    r"^(?P<spot>Spot Preemptible )?(?P<family>.+?) Instance (?P<part>Core|Ram) running in "
)
_UNITS = {"Core": "h", "Ram": "GiBy.h", "GPU": "h"}


def gpu_sku_description(gpu: str, usage_type: str, location: str) -> str:
    """A GPU SKU's description, e.g. "Nvidia Tesla T4 GPU running in Americas"."""
    spot = "attached to Spot Preemptible VMs " if usage_type == "Preemptible" else ""
    return f"{GPU_SKU_NAMES[gpu]} GPU {spot}running in {location}"


def host_sku_description(family: str, part: str, usage_type: str, location: str) -> str:
    """A host SKU's description, e.g. "Spot Preemptible A2 Instance Core running in EMEA"."""
    spot = "Spot Preemptible " if usage_type == "Preemptible" else ""
    return f"{spot}{FAMILY_SKU_NAMES[family]} Instance {part} running in {location}"


def money_nanos(units: int | str, nanos: int) -> int:
    """A ``google.type.Money`` amount (units + nanos) in nano-dollars."""
    return int(units) * 1_000_000_000 + int(nanos)


def nanos_to_micros(nanos: Decimal | int) -> int:
    """Nano-dollars to whole micro-dollars (half-even)."""
    value = Decimal(nanos) / NANOS_PER_MICRO
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


SkuKey = tuple[str, str, str, str]  # (kind: "Core"|"Ram"|"GPU", family or GPU, region, market)


@dataclass
class SkuPrices:
    """Unit prices (nano-dollars per hour, or per GiB-hour for Ram) by :data:`SkuKey`."""

    prices: dict[SkuKey, int] = field(default_factory=dict)

    def get(self, kind: str, name: str, region: str, market: str) -> int | None:
        return self.prices.get((kind, name, region, market))

    def compose_micros(
        self,
        family: str,
        vcpus: float,
        ram_gb: float,
        gpu: str,
        gpu_count: int,
        region: str,
        market: str,
    ) -> int | None:
        """Host (vCPUs x Core + GiB x Ram) + count x GPU in micro-dollars per hour; None
        when one of the three SKUs is not listed for that region and market."""
        core = self.get("Core", family, region, market)
        ram = self.get("Ram", family, region, market)
        per_gpu = self.get("GPU", gpu, region, market)
        if core is None or ram is None or per_gpu is None:
            return None
        total = Decimal(str(vcpus)) * core + Decimal(str(ram_gb)) * ram + gpu_count * per_gpu
        return nanos_to_micros(total)


def _sku_key(description: str, usage_type: str) -> tuple[str, str, str] | None:
    """(kind, family or GPU, market) a SKU prices, or None for SKUs no offer uses."""
    market = _MARKETS.get(usage_type)
    if market is None:
        return None
    gpu = _GPU_SKU.match(description)
    if gpu:
        name = _GPU_MODELS.get(gpu["model"])
        if name is None or bool(gpu["spot"]) != (market == "spot"):
            return None
        return "GPU", name, market
    host = _HOST_SKU.match(description)
    if host:
        family = _FAMILIES.get(host["family"])
        if family is None or bool(host["spot"]) != (market == "spot"):
            return None
        return host["part"], family, market
    return None


def index_skus(skus: Iterable[Any]) -> SkuPrices:
    """The unit prices of the SKUs offers are composed from, by region (the first SKU listing
    a region wins). Takes ``google.cloud.billing_v1.Sku`` messages; the newest pricing info
    and its first tier count, in USD."""
    found = SkuPrices()
    for sku in skus:
        key = _sku_key(sku.description, sku.category.usage_type)
        if key is None or not sku.pricing_info:
            continue
        kind, name, market = key
        expression = sku.pricing_info[-1].pricing_expression
        if expression.usage_unit != _UNITS[kind] or not expression.tiered_rates:
            continue
        price = expression.tiered_rates[0].unit_price
        if price.currency_code not in ("", "USD"):
            continue
        nanos = money_nanos(price.units, price.nanos)
        for region in sku.service_regions:
            found.prices.setdefault((kind, name, region, market), nanos)
    return found
