"""Live catalog refresh through the clouds' own clients (boto3, google-cloud-compute).

AWS: current spot prices (``describe_spot_price_history``), shapes (``describe_instance_types``)
and which zones offer each type (``describe_instance_type_offerings``). GCP: which zones are
up and which machine and accelerator types each zone lists; the Compute API publishes no
prices, so GCP prices stay those of the snapshot. Rows a cloud no longer offers are dropped.
A failed refresh returns the table it was given, with the error, and logs why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np

from broker.core.money import to_micros
from broker.core.offers import OfferTable
from pricing.gcp_catalog import GCE_ACCELERATOR_TYPES

logger = logging.getLogger(__name__)

SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


@dataclass(frozen=True)
class PriceSnapshot:
    """What one refresh saw: its source, when, and how many rows it changed or dropped."""

    source: str
    taken_at: datetime
    regions: tuple[str, ...]
    rows_updated: int
    rows_dropped: int


@dataclass(frozen=True)
class RefreshResult:
    """The table to use from now on, the snapshot behind it, or the error that kept the old."""

    table: OfferTable
    snapshot: PriceSnapshot | None
    error: str | None = None


def _as_of(now: datetime) -> np.datetime64:
    return np.datetime64(int(now.timestamp()), "s")


def _aws_region(ec2: Any, types: list[str]) -> tuple[dict, dict, set]:
    """(shape by type, spot micros by (type, zone id), offered (type, zone id)) for a region."""
    zone_ids = {
        z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]
    }
    by_type = [{"Name": "instance-type", "Values": types}]
    offered = {
        (o["InstanceType"], o["Location"])
        for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id", Filters=by_type
        )
        for o in page["InstanceTypeOfferings"]
    }
    shapes = {
        t["InstanceType"]: t
        for page in ec2.get_paginator("describe_instance_types").paginate(Filters=by_type)
        for t in page["InstanceTypes"]
    }
    latest: dict[tuple[str, str], tuple[datetime, str]] = {}
    for page in ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types, ProductDescriptions=list(SPOT_PRODUCTS)
    ):
        for item in page["SpotPriceHistory"]:
            key = (item["InstanceType"], zone_ids.get(item["AvailabilityZone"], ""))
            if key not in latest or item["Timestamp"] > latest[key][0]:
                latest[key] = (item["Timestamp"], item["SpotPrice"])
    spot = {key: to_micros(Decimal(price)) for key, (_, price) in latest.items()}
    return shapes, spot, offered


def refresh_aws(
    table: OfferTable,
    now: datetime,
    session: Any = None,
    endpoint_url: str | None = None,
    regions: Iterable[str] | None = None,
) -> RefreshResult:
    """New spot prices, shapes and availability for the table's AWS rows (via boto3)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = session or boto3.session.Session()
    aws = table.provider == "aws"
    wanted = sorted(set(regions) if regions is not None else set(table.region[aws].tolist()))
    spot = table.spot_micros_per_hour.copy()
    vcpus, ram, gpu_mem = table.vcpus.copy(), table.ram_gb.copy(), table.gpu_memory_gb.copy()
    as_of = table.price_as_of.copy()
    keep = np.ones(len(table), dtype=bool)
    updated = 0
    try:
        for region in wanted:
            rows = np.flatnonzero(aws & (table.region == region))
            types = sorted(set(table.instance_type[rows].tolist()))
            ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url)
            shapes, prices, offered = _aws_region(ec2, types)
            for i in rows:
                key = (str(table.instance_type[i]), str(table.zone[i]))
                keep[i] = key in offered
                if key in prices:
                    spot[i], as_of[i] = prices[key], _as_of(now)
                    updated += 1
                shape = shapes.get(key[0])
                if shape:
                    vcpus[i] = shape["VCpuInfo"]["DefaultVCpus"]
                    ram[i] = shape["MemoryInfo"]["SizeInMiB"] / 1024
                    gpus = shape.get("GpuInfo", {}).get("Gpus") or [{}]
                    gpu_mem[i] = (
                        gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024 or gpu_mem[i]
                    )
    except (BotoCoreError, ClientError) as exc:
        logger.warning(
            "AWS price refresh failed; keeping the last catalog", extra={"error": str(exc)}
        )
        return RefreshResult(table, None, f"aws refresh failed: {exc}")
    new = table.replace(
        spot_micros_per_hour=spot, vcpus=vcpus, ram_gb=ram, gpu_memory_gb=gpu_mem, price_as_of=as_of
    ).take(keep)
    snapshot = PriceSnapshot("aws", now, tuple(wanted), updated, int((~keep).sum()))
    return RefreshResult(new, snapshot)


def _gcp_zone_catalog(clients: dict[str, Any], project: str, zone: str) -> tuple[dict, dict]:
    machines = {m.name: m for m in clients["machines"].list(project=project, zone=zone)}
    accelerators = {
        a.name: a.maximum_cards_per_instance
        for a in clients["accelerators"].list(project=project, zone=zone)
    }
    return machines, accelerators


def refresh_gcp(
    table: OfferTable,
    now: datetime,
    project: str,
    endpoint_url: str | None = None,
    credentials: Any = None,
) -> RefreshResult:
    """Availability and shapes for the table's GCP rows (via google-cloud-compute).

    A plain-http ``endpoint_url`` (a local fake) gets anonymous credentials unless given.
    """
    import requests
    from google.api_core.client_options import ClientOptions
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import compute_v1

    if credentials is None and endpoint_url and endpoint_url.startswith("http://"):
        credentials = AnonymousCredentials()
    options = ClientOptions(api_endpoint=endpoint_url) if endpoint_url else None
    kwargs = {"credentials": credentials, "client_options": options, "transport": "rest"}
    gcp = table.provider == "gcp"
    vcpus, ram = table.vcpus.copy(), table.ram_gb.copy()
    keep = ~gcp
    try:
        clients: dict[str, Any] = {
            "zones": compute_v1.ZonesClient(**kwargs),
            "machines": compute_v1.MachineTypesClient(**kwargs),
            "accelerators": compute_v1.AcceleratorTypesClient(**kwargs),
        }
        up = {z.name for z in clients["zones"].list(project=project) if z.status == "UP"}
        zones = sorted(set(table.zone[gcp].tolist()) & up)
        for zone in zones:
            machines, accelerators = _gcp_zone_catalog(clients, project, zone)
            for i in np.flatnonzero(gcp & (table.zone == zone)):
                machine = machines.get(str(table.instance_type[i]))
                attached = str(table.instance_type[i]).startswith("n1-")
                cards = accelerators.get(GCE_ACCELERATOR_TYPES.get(str(table.gpu[i]), ""), 0)
                keep[i] = machine is not None and (not attached or cards >= table.gpu_count[i])
                if machine is not None:
                    vcpus[i], ram[i] = machine.guest_cpus, machine.memory_mb / 1024
    except (GoogleAPIError, GoogleAuthError, requests.RequestException) as exc:
        logger.warning(
            "GCP catalog refresh failed; keeping the last catalog", extra={"error": str(exc)}
        )
        return RefreshResult(table, None, f"gcp refresh failed: {exc}")
    regions = tuple(sorted({z.rsplit("-", 1)[0] for z in zones}))
    dropped = int((gcp & ~keep).sum())
    new = table.replace(vcpus=vcpus, ram_gb=ram).take(keep)
    return RefreshResult(new, PriceSnapshot("gcp", now, regions, 0, dropped))
