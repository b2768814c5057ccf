"""The Compute Engine SKUs the billing fake serves, derived from the bundled GCP catalog rows.

GPU SKUs, per (GPU, region, usage type): an accelerator row's price / its GPU count (the row
with the most GPUs, whose per-GPU price the source rounded least). Host SKUs, per (machine
family, region, usage type): the vCPU (Core) and per-GiB memory (Ram) prices that fit the
family's host rows there by least squares. Where every shape of a family in a region has the
same GiB per vCPU (G2 everywhere; A2 or N1 where one shape line is listed) the rows fix only
their sum, so the split takes the Ram:Core price ratio of the family's other regions (their
median), else of every family; the composed host prices are the same whichever split.

The source rounded every price to 5 decimals (10 micro-dollars), so a composition reproduces
a catalog row within a few micro-dollars, not exactly: :func:`host_fit_residual` measures it.

A market change of an offer's price (``MarketReplay.set_price`` / ``stage_price`` on
provider "gcp") is expressed on the offer's GPU SKU: per-GPU price = (new price - host
price) / GPU count, in the offer's region and usage type, so it moves every offer of that
GPU in that region (a negative result is clamped at 0; ``NO_PRICE`` withdraws the SKU). An N1
change without ``gpu`` applies to every GPU that host carries in that zone.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from functools import cache
from typing import Any

import numpy as np

from broker.core.offers import NO_PRICE, OfferTable
from pricing.gcp_catalog import WHOLE_GPU_MACHINES, load_gcp_offers, read_gcp_rows
from pricing.gcp_skus import (
    COMPUTE_SERVICE,
    NANOS_PER_MICRO,
    USAGE_TYPES,
    SkuKey,
    gpu_sku_description,
    host_sku_description,
)
from providers.local.market import PriceChange

logger = logging.getLogger(__name__)

_MARKETS = ("on_demand", "spot")
_GEOS = {
    "us": "Americas",
    "northamerica": "Americas",
    "southamerica": "Americas",
    "europe": "EMEA",
    "me": "EMEA",
    "africa": "EMEA",
    "asia": "APAC",
    "australia": "APAC",
}
_UNITS = {  # usage unit, its description, base unit, its description, conversion factor
    "h": ("hour", "s", "second", 3600.0),
    "GiBy.h": ("gibibyte hour", "By.s", "byte second", 3865470566400.0),
}


def _round(value: Decimal | float) -> int:
    return int(Decimal(str(value)).to_integral_value(rounding=ROUND_HALF_EVEN))


def _region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _family(machine: str) -> str:
    return machine.split("-", 1)[0]


def gpu_unit_prices() -> dict[SkuKey, int]:
    """Per-GPU nano-dollars per hour by ("GPU", source GPU name, region, market)."""
    _, accelerators = read_gcp_rows()
    best: dict[SkuKey, tuple[int, int]] = {}  # key -> (count, nanos)
    for (name, count, zone), accelerator in sorted(accelerators.items()):
        for market in _MARKETS:
            micros = getattr(accelerator.price, market)
            key = ("GPU", name, _region(zone), market)
            if micros != NO_PRICE and count > best.get(key, (0, 0))[0]:
                best[key] = (count, _round(Decimal(micros * NANOS_PER_MICRO) / count))
    return {key: nanos for key, (_, nanos) in best.items()}


def _host_points() -> dict[tuple[str, str, str], list[tuple[float, float, int]]]:
    """(vCPUs, GiB, micros) of the host rows by (family, region, market)."""
    hosts, _ = read_gcp_rows()
    points: dict[tuple[str, str, str], list[tuple[float, float, int]]] = defaultdict(list)
    for (machine, zone), host in sorted(hosts.items()):
        for market in _MARKETS:
            micros = getattr(host.price, market)
            if micros != NO_PRICE:
                points[_family(machine), _region(zone), market].append(
                    (host.vcpus, host.ram_gb, micros)
                )
    return points


@cache
def host_unit_prices() -> dict[SkuKey, int]:
    """Core (per vCPU-hour) and Ram (per GiB-hour) nano-dollars by (kind, family, region,
    market), fitted to the catalog's host rows."""
    points = _host_points()
    fits: dict[tuple[str, str, str], tuple[float, float]] = {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for key, rows in points.items():
        a = np.array([(v, m) for v, m, _ in rows])
        if np.linalg.matrix_rank(a) == 2:
            (core, ram), *_ = np.linalg.lstsq(a, np.array([p for *_, p in rows]), rcond=None)
            fits[key] = (core, ram)
            ratios[key[0]].append(ram / core)
    every = statistics.median(r for family in ratios.values() for r in family)
    for key, rows in points.items():
        if key in fits:
            continue
        ratio = statistics.median(ratios[key[0]]) if ratios[key[0]] else every
        weights = np.array([v + ratio * m for v, m, _ in rows])
        core = float(weights @ np.array([p for *_, p in rows]) / (weights @ weights))
        fits[key] = (core, ratio * core)
    prices: dict[SkuKey, int] = {}
    for (family, region, market), (core, ram) in fits.items():
        prices["Core", family, region, market] = _round(core * NANOS_PER_MICRO)
        prices["Ram", family, region, market] = _round(ram * NANOS_PER_MICRO)
    return prices


def host_fit_residual() -> int:
    """The largest difference, in micro-dollars, between a catalog host row and the host
    price composed from the fitted Core and Ram SKUs."""
    prices = host_unit_prices()
    worst = Decimal(0)
    for (family, region, market), rows in _host_points().items():
        core, ram = prices["Core", family, region, market], prices["Ram", family, region, market]
        for vcpus, gib, micros in rows:
            composed = (Decimal(str(vcpus)) * core + Decimal(str(gib)) * ram) / NANOS_PER_MICRO
            worst = max(worst, abs(composed - micros))
    return int(worst.to_integral_value(rounding="ROUND_CEILING"))


def base_prices() -> dict[SkuKey, int]:
    """Every SKU's unit price from the catalog alone."""
    return {**host_unit_prices(), **gpu_unit_prices()}


def apply_changes(
    prices: dict[SkuKey, int],
    since: dict[SkuKey, datetime],
    changes: Iterable[PriceChange],
    offers: OfferTable | None = None,
) -> None:
    """Express market changes of GCP offer prices on their GPU SKUs (module docstring)."""
    table = offers if offers is not None else load_gcp_offers()
    for change in changes:
        rows = np.flatnonzero(
            (table.zone == change.zone)
            & (table.instance_type == change.instance_type)
            & ((table.gpu == change.gpu) if change.gpu else True)
        )
        if len(rows) == 0:
            logger.warning("price change of an offer the catalog lacks", extra={"change": change})
        for i in rows:
            machine, count = change.instance_type, int(table.gpu_count[i])
            gpu = WHOLE_GPU_MACHINES.get(machine, (str(table.gpu[i]), count))[0]
            region, family = str(table.region[i]), _family(machine)
            key: SkuKey = ("GPU", gpu, region, change.market)
            since[key] = change.effective_at
            if change.micros_per_hour == NO_PRICE:
                prices.pop(key, None)
                continue
            core = prices.get(("Core", family, region, change.market))
            ram = prices.get(("Ram", family, region, change.market))
            if core is None or ram is None:
                logger.warning("no host SKU to express a price change on", extra={"key": key})
                continue
            host = Decimal(str(table.vcpus[i])) * core + Decimal(str(table.ram_gb[i])) * ram
            target = Decimal(change.micros_per_hour * NANOS_PER_MICRO)
            prices[key] = max(0, _round((target - host) / count))


def sku_resources(
    prices: dict[SkuKey, int], since: dict[SkuKey, datetime], default_since: datetime
) -> list[dict[str, Any]]:
    """The SKUs in the Cloud Billing Catalog API's JSON shape: one per (kind, name, usage
    type, geography, price), listing the regions it serves, in a stable order."""
    groups: dict[tuple[str, str, str, str, int, datetime], list[str]] = defaultdict(list)
    for (kind, name, region, market), nanos in sorted(prices.items()):
        when = since.get((kind, name, region, market), default_since)
        geo = _GEOS.get(region.split("-", 1)[0], "Global")
        groups[kind, name, market, geo, nanos, when].append(region)
    skus = []
    for (kind, name, market, location, nanos, when), regions in groups.items():
        usage = USAGE_TYPES[market]
        if kind == "GPU":
            description, group = gpu_sku_description(name, usage, location), "GPU"
        else:
            description = host_sku_description(name, kind, usage, location)
            group = "N1Standard" if name == "n1" else {"Core": "CPU", "Ram": "RAM"}[kind]
        unit = "GiBy.h" if kind == "Ram" else "h"
        unit_text, base, base_text, factor = _UNITS[unit]
        digest = hashlib.sha1(f"{description}|{','.join(regions)}".encode()).hexdigest().upper()
        sku_id = f"{digest[:4]}-{digest[4:8]}-{digest[8:12]}"
        skus.append(
            {
                "name": f"{COMPUTE_SERVICE}/skus/{sku_id}",
                "skuId": sku_id,
                "description": description,
                "category": {
                    "serviceDisplayName": "Compute Engine",
                    "resourceFamily": "Compute",
                    "resourceGroup": group,
                    "usageType": usage,
                },
                "serviceRegions": regions,
                "pricingInfo": [
                    {
                        "effectiveTime": when.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                        "summary": "",
                        "pricingExpression": {
                            "usageUnit": unit,
                            "displayQuantity": 1,
                            "tieredRates": [
                                {
                                    "startUsageAmount": 0,
                                    "unitPrice": {
                                        "currencyCode": "USD",
                                        "units": str(nanos // 1_000_000_000),
                                        "nanos": nanos % 1_000_000_000,
                                    },
                                }
                            ],
                            "usageUnitDescription": unit_text,
                            "baseUnit": base,
                            "baseUnitDescription": base_text,
                            "baseUnitConversionFactor": factor,
                        },
                        "aggregationInfo": {
                            "aggregationLevel": "ACCOUNT",
                            "aggregationInterval": "DAILY",
                            "aggregationCount": 1,
                        },
                        "currencyConversionRate": 1,
                    }
                ],
                "serviceProviderName": "Google",
                "geoTaxonomy": {
                    "type": "MULTI_REGIONAL" if len(regions) > 1 else "REGIONAL",
                    "regions": regions,
                },
            }
        )
    return skus
