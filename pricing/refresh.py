"""Live prices from the clouds' own pricing APIs, through their real clients.

AWS (boto3): on-demand from the Price List API (``pricing`` ``get_products``, one product per
instance type and region), spot from ``describe_spot_price_history`` (the newest price per
instance type and zone), and which zones still offer each type
(``describe_instance_type_offerings``). GCP: the Cloud Billing Catalog API
(``google-cloud-billing`` ``CloudCatalogClient.list_skus``), offer prices composed from host
and GPU SKUs (:mod:`pricing.gcp_skus`); the Compute API says which zones are up and which
machine and accelerator types each lists.

A refresh returns :class:`~broker.core.offers.PriceObservation` rows for the table it is
given, all observed at ``now``; a row the cloud no longer offers gets ``NO_PRICE`` in both
markets. A failed refresh returns no observations and the error, and logs it; it never raises.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np

from broker.core.money import to_micros
from broker.core.offers import NO_PRICE, OfferTable, PriceObservation
from pricing.gcp_catalog import GCE_ACCELERATOR_TYPES, WHOLE_GPU_MACHINES
from pricing.gcp_skus import COMPUTE_SERVICE, index_skus

logger = logging.getLogger(__name__)

AWS_PRICING = "aws-pricing"
AWS_SPOT_HISTORY = "aws-spot-history"
GCP_CLOUD_BILLING = "gcp-cloud-billing"
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
PRICE_LIST_REGION = "us-east-1"  # where the Price List API answers
# One Linux on-demand product per instance type and region (no reservations, no bundled
# software, no Capacity Blocks, which share every other attribute for GPU types).
PRICE_LIST_TERMS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
}


@dataclass(frozen=True)
class RefreshOutcome:
    """What one refresh of one cloud saw: its observations, or why it failed."""

    source: str  # "aws" | "gcp"
    observations: list[PriceObservation]
    error: str | None = None  # set when the refresh failed (observations then empty)


def _observe(
    table: OfferTable, i: int, market: str, micros: int, now: datetime, source: str
) -> PriceObservation:
    return PriceObservation(
        provider=str(table.provider[i]),
        region=str(table.region[i]),
        zone=str(table.zone[i]),
        instance_type=str(table.instance_type[i]),
        market=market,
        micros_per_hour=int(micros),
        observed_at=now,
        source=source,
        gpu=str(table.gpu[i]),
    )


def _failed(source: str, exc: BaseException) -> RefreshOutcome:
    error = f"{source} refresh failed: {type(exc).__name__}: {exc}"
    logger.warning("price refresh failed; prices stay as stored", extra={"error": error})
    return RefreshOutcome(source, [], error)


def on_demand_usd(item: str | dict[str, Any]) -> Decimal | None:
    """The hourly USD price of one Price List product (a JSON string as ``get_products``
    returns it); None for a product with no on-demand hourly price or a zero one."""
    data = json.loads(item) if isinstance(item, str) else item
    if data.get("product", {}).get("attributes", {}).get("marketoption", "OnDemand") != "OnDemand":
        return None
    for term in data.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if dimension.get("unit") == "Hrs" and usd and Decimal(usd) > 0:
                return Decimal(usd)
    return None


def _price_list(pricing: Any, instance_type: str, region: str) -> int | None:
    terms = {**PRICE_LIST_TERMS, "instanceType": instance_type, "regionCode": region}
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]
    prices = {
        usd
        for page in pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"
        )
        for item in page["PriceList"]
        if (usd := on_demand_usd(item)) is not None
    }
    if len(prices) > 1:
        logger.warning(
            "several on-demand prices listed; taking the highest",
            extra={"instance_type": instance_type, "region": region, "prices": sorted(prices)},
        )
    return to_micros(max(prices)) if prices else None


def _aws_region(ec2: Any, types: list[str], now: datetime) -> tuple[set, dict]:
    """(offered (type, zone id), spot micros by (type, zone id)) in one region."""
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
    # From ``now``: EC2 includes the price in effect at StartTime, so the newest is current.
    latest: dict[tuple[str, str], tuple[datetime, str]] = {}
    for page in ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types, ProductDescriptions=list(SPOT_PRODUCTS), StartTime=now
    ):
        for item in page["SpotPriceHistory"]:
            zone_id = item.get("AvailabilityZoneId") or zone_ids.get(item["AvailabilityZone"], "")
            key = (item["InstanceType"], zone_id)
            if key not in latest or item["Timestamp"] > latest[key][0]:  # newest listed first
                latest[key] = (item["Timestamp"], item["SpotPrice"])
    spot = {key: to_micros(Decimal(price)) for key, (_, price) in latest.items()}
    return offered, spot


def refresh_aws(
    table: OfferTable,
    now: datetime,
    session: Any = None,
    endpoint_url: str | None = None,
    regions: Iterable[str] | None = None,
) -> RefreshOutcome:
    """On-demand (Price List API) and spot (spot price history) prices of the table's AWS
    rows in ``regions`` (default: every region of the table), via boto3."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    aws = table.provider == "aws"
    present = set(table.region[aws].tolist())
    wanted = sorted(present if regions is None else present & set(regions))
    observations: list[PriceObservation] = []
    try:
        session = session or boto3.session.Session()
        pricing = session.client(
            "pricing", region_name=PRICE_LIST_REGION, endpoint_url=endpoint_url
        )
        for region in wanted:
            rows = np.flatnonzero(aws & (table.region == region))
            types = sorted(set(table.instance_type[rows].tolist()))
            ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url)
            offered, spot = _aws_region(ec2, types, now)
            on_demand = {t: _price_list(pricing, t, region) for t in types}
            for i in rows:
                key = (str(table.instance_type[i]), str(table.zone[i]))
                if key not in offered:  # each market's source says it is gone
                    observations.append(_observe(table, i, "on_demand", NO_PRICE, now, AWS_PRICING))
                    observations.append(_observe(table, i, "spot", NO_PRICE, now, AWS_SPOT_HISTORY))
                    continue
                if on_demand[key[0]] is not None:
                    price = on_demand[key[0]]
                    observations.append(_observe(table, i, "on_demand", price, now, AWS_PRICING))
                if key in spot:
                    price = spot[key]
                    observations.append(_observe(table, i, "spot", price, now, AWS_SPOT_HISTORY))
    except (BotoCoreError, ClientError) as exc:
        return _failed("aws", exc)
    except Exception as exc:  # never raise: the caller keeps the stored prices
        logger.exception("unexpected failure of the AWS price refresh")
        return _failed("aws", exc)
    return RefreshOutcome("aws", observations)


def _gcp_availability(
    compute: dict[str, Any], project: str, table: OfferTable, rows: np.ndarray
) -> tuple[set[str], set[tuple[str, str]], dict[tuple[str, str], int]]:
    """(zones up, (zone, machine type) listed, max cards by (zone, accelerator type))."""
    up = {z.name for z in compute["zones"].list(project=project) if z.status == "UP"}
    machines = sorted(set(table.instance_type[rows].tolist()))
    accelerators = sorted(set(GCE_ACCELERATOR_TYPES.values()))
    listed: set[tuple[str, str]] = set()
    for scope, scoped in compute["machines"].aggregated_list(
        request={"project": project, "filter": f'name eq "({"|".join(machines)})"'}
    ):
        listed |= {(scope.rsplit("/", 1)[-1], m.name) for m in scoped.machine_types}
    cards: dict[tuple[str, str], int] = {}
    for scope, scoped in compute["accelerators"].aggregated_list(
        request={"project": project, "filter": f'name eq "({"|".join(accelerators)})"'}
    ):
        zone = scope.rsplit("/", 1)[-1]
        for accelerator in scoped.accelerator_types:
            cards[zone, accelerator.name] = accelerator.maximum_cards_per_instance
    return up, listed, cards


def _client_kwargs(endpoint_url: str | None, credentials: Any) -> dict[str, Any]:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    if credentials is None and endpoint_url and endpoint_url.startswith("http://"):
        credentials = AnonymousCredentials()  # a local fake: nothing to authenticate
    options = ClientOptions(api_endpoint=endpoint_url) if endpoint_url else None
    return {"credentials": credentials, "client_options": options, "transport": "rest"}


def refresh_gcp(
    table: OfferTable,
    now: datetime,
    project: str,
    endpoint_url: str | None = None,
    credentials: Any = None,
    billing_endpoint_url: str | None = None,
) -> RefreshOutcome:
    """On-demand and spot prices of the table's GCP rows from the Cloud Billing Catalog API
    (host + GPU SKUs), where the Compute API (``endpoint_url``) still offers them.

    A plain-http endpoint (a local fake) gets anonymous credentials unless given.
    """
    import requests
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import billing_v1, compute_v1

    rows = np.flatnonzero(table.provider == "gcp")
    if len(rows) == 0:
        return RefreshOutcome("gcp", [])
    observations: list[PriceObservation] = []
    try:
        kwargs = _client_kwargs(endpoint_url, credentials)
        compute = {
            "zones": compute_v1.ZonesClient(**kwargs),
            "machines": compute_v1.MachineTypesClient(**kwargs),
            "accelerators": compute_v1.AcceleratorTypesClient(**kwargs),
        }
        up, listed, cards = _gcp_availability(compute, project, table, rows)
        catalog = billing_v1.CloudCatalogClient(**_client_kwargs(billing_endpoint_url, credentials))
        skus = index_skus(catalog.list_skus(parent=COMPUTE_SERVICE))
        for i in rows:
            zone, machine = str(table.zone[i]), str(table.instance_type[i])
            gpu, _ = WHOLE_GPU_MACHINES.get(machine, (str(table.gpu[i]), 0))
            count = int(table.gpu_count[i])
            accelerator = (zone, GCE_ACCELERATOR_TYPES.get(gpu, ""))
            offered = (
                zone in up
                and (zone, machine) in listed
                and (machine in WHOLE_GPU_MACHINES or cards.get(accelerator, 0) >= count)
            )
            family, region = machine.split("-", 1)[0], str(table.region[i])
            vcpus, ram_gb = float(table.vcpus[i]), float(table.ram_gb[i])
            for market in ("on_demand", "spot"):
                price = (
                    skus.compose_micros(family, vcpus, ram_gb, gpu, count, region, market)
                    if offered
                    else None
                )
                micros = NO_PRICE if price is None else price
                observations.append(_observe(table, i, market, micros, now, GCP_CLOUD_BILLING))
    except (GoogleAPIError, GoogleAuthError, requests.RequestException) as exc:
        return _failed("gcp", exc)
    except Exception as exc:  # never raise: the caller keeps the stored prices
        logger.exception("unexpected failure of the GCP price refresh")
        return _failed("gcp", exc)
    return RefreshOutcome("gcp", observations)


def probe_aws(session: Any, endpoint_url: str | None, region: str, instance_type: str) -> str:
    """One Price List product and one page of spot price history, as a refresh asks for them
    (raises what boto3 raises)."""
    pricing = session.client("pricing", region_name=PRICE_LIST_REGION, endpoint_url=endpoint_url)
    price = _price_list(pricing, instance_type, region)
    ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url)
    history = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type], ProductDescriptions=list(SPOT_PRODUCTS), MaxResults=5
    )["SpotPriceHistory"]
    listed = "no product" if price is None else f"${price / 1_000_000:.4f}/h on demand"
    return f"{instance_type} in {region}: {listed}, {len(history)} spot price(s)"


def probe_gcp(billing_endpoint_url: str | None, credentials: Any = None) -> str:
    """The first page of Compute Engine's SKUs from the Cloud Billing Catalog API."""
    from google.cloud import billing_v1

    catalog = billing_v1.CloudCatalogClient(**_client_kwargs(billing_endpoint_url, credentials))
    page = next(iter(catalog.list_skus(request={"parent": COMPUTE_SERVICE, "page_size": 50}).pages))
    return f"Compute Engine SKUs answer ({len(page.skus)} on the first page)"
