"""Local AWS prices, which moto lacks: the Price List API's ``GetProducts`` (JSON 1.1) here,
and a real EC2 ``DescribeSpotPriceHistory`` (query protocol, XML) in ``aws_spot_history.py``.

Both serve the bundled AWS catalog (``pricing/aws_catalog.py``) as the market has moved it
(``MarketReplay.price_changes``): on-demand as one Linux product per (instance type, region),
spot as a history per (instance type, zone) that starts with the catalog's price at the
market's start. On-demand is a regional price, so a change of one zone's on-demand price
sets its region's product; a change to ``NO_PRICE`` withdraws the product (or hides the
spot history while it is in effect).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

from broker.core.money import from_micros
from broker.core.offers import NO_PRICE, OfferTable
from pricing.aws_catalog import load_aws_csv
from providers.local.faults import Fault
from providers.local.market import MarketReplay
from providers.local.paging import page_offset, page_token, query_key

StartResponse = Callable[..., Any]
ON_DEMAND_TERM, HOURLY_RATE = "JRTCKXETXF", "6YS6EN2CT7"  # the Price List's on-demand codes
MAX_PRODUCTS = 100
_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
_JSON = "application/x-amz-json-1.1"
_FAULTS = {
    Fault.THROTTLE: ("400 Bad Request", "ThrottlingException"),
    Fault.SERVER_ERROR: ("500 Internal Server Error", "InternalErrorException"),
    Fault.UNAVAILABLE: ("503 Service Unavailable", "ServiceUnavailableException"),
}


def respond(start_response: StartResponse, status: str, body: str, kind: str) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", kind), ("Content-Length", str(len(data)))])
    return [data]


def pricing_error(
    start_response: StartResponse, status: str, code: str, message: str
) -> list[bytes]:
    """Answer with the Price List API's JSON error document."""
    body = json.dumps({"__type": code, "Message": message})
    return respond(start_response, status, body, _JSON)


def pricing_fault(start_response: StartResponse, fault: Fault) -> list[bytes]:
    """The Price List API's answer to an injected fault."""
    status, code = _FAULTS[fault]
    return pricing_error(start_response, status, code, f"injected fault: {fault}")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _matches(value: str | None, kind: str, wanted: str) -> bool:
    if kind == "ANY_OF":
        return value in {v.strip() for v in wanted.split(",")}
    if kind == "NONE_OF":
        return value not in {v.strip() for v in wanted.split(",")}
    if value is None:
        return False
    return wanted in value if kind == "CONTAINS" else value == wanted


@dataclass(frozen=True)
class _Zone:
    name: str
    zone_id: str
    region: str


class AwsPrices:
    """The catalog's AWS prices, moved by the market, as the two pricing APIs answer them."""

    def __init__(self, market: MarketReplay | None, catalog: OfferTable | None = None) -> None:
        self.market = market
        self._catalog = catalog

    @cached_property
    def catalog(self) -> OfferTable:
        return self._catalog if self._catalog is not None else load_aws_csv()

    @cached_property
    def zones(self) -> dict[str, _Zone]:
        """moto's zones by name and by id."""
        found: dict[str, _Zone] = {}
        for region, zones in RegionsAndZonesBackend.zones.items():
            for zone in zones:
                found[zone.name] = found[zone.zone_id] = _Zone(zone.name, zone.zone_id, region)
        return found

    def start(self) -> datetime:
        """When the catalog's prices took effect: the market's start."""
        return self.market.start_time if self.market is not None else _EPOCH

    def changes(self, market: str) -> Iterable[Any]:
        """The market's AWS price changes in effect, of one market, oldest first."""
        if self.market is None:
            return []
        return [c for c in self.market.price_changes("aws") if c.market == market]

    def offer_catalog_types(self) -> None:
        """Make moto offer every instance type where the catalog lists it (moto's offerings
        data lags: it has no p3.2xlarge in us-east-1), so what the local AWS prices it also
        offers. Idempotent; moto keeps offerings per process."""
        from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS

        t = self.catalog
        known: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for itype, zone_id in sorted(
            set(zip(t.instance_type.tolist(), t.zone.tolist(), strict=True))
        ):
            zone = self.zones.get(zone_id)
            if zone is None:
                continue
            for kind, location in (
                ("availability-zone-id", zone.zone_id),
                ("availability-zone", zone.name),
                ("region", zone.region),
            ):
                offerings = INSTANCE_TYPE_OFFERINGS[kind].setdefault(zone.region, [])
                if (kind, zone.region) not in known:
                    known[kind, zone.region] = {
                        (o["InstanceType"], o["Location"]) for o in offerings
                    }
                if (itype, location) not in known[kind, zone.region]:
                    known[kind, zone.region].add((itype, location))
                    offerings.append(
                        {"InstanceType": itype, "Location": location, "LocationType": kind}
                    )

    # --- Price List API ---------------------------------------------------------------

    def on_demand(self) -> dict[tuple[str, str], tuple[int, datetime]]:
        """(micros, since when) by (instance type, region)."""
        t = self.catalog
        prices: dict[tuple[str, str], tuple[int, datetime]] = {}
        for region, instance_type, price in zip(
            t.region.tolist(),
            t.instance_type.tolist(),
            t.on_demand_micros_per_hour.tolist(),
            strict=True,
        ):
            prices.setdefault((instance_type, region), (int(price), self.start()))
        for change in self.changes("on_demand"):
            zone = self.zones.get(change.zone)
            region = zone.region if zone else change.zone[:-1]  # a zone name: region + letter
            prices[change.instance_type, region] = (change.micros_per_hour, change.effective_at)
        return {key: value for key, value in prices.items() if value[0] != NO_PRICE}

    def products(self) -> list[dict[str, Any]]:
        """Every on-demand product, in the Price List's JSON shape, in a stable order."""
        t = self.catalog
        shapes = {
            itype: (gpu, int(count), vcpus, ram, mem)
            for itype, gpu, count, vcpus, ram, mem in zip(
                t.instance_type.tolist(),
                t.gpu.tolist(),
                t.gpu_count.tolist(),
                t.vcpus.tolist(),
                t.ram_gb.tolist(),
                t.gpu_memory_gb.tolist(),
                strict=True,
            )
        }
        items = []
        for (itype, region), (micros, since) in sorted(self.on_demand().items()):
            gpu, count, vcpus, ram, mem = shapes.get(itype, ("", 0, 0.0, 0.0, 0.0))
            sku = hashlib.sha1(f"{itype}|{region}".encode()).hexdigest()[:16].upper()
            usd = f"{from_micros(micros):.10f}"
            dimension = f"{sku}.{ON_DEMAND_TERM}.{HOURLY_RATE}"
            attributes = {
                "servicecode": "AmazonEC2",
                "servicename": "Amazon Elastic Compute Cloud",
                "instanceType": itype,
                "instanceFamily": "GPU instance",
                "regionCode": region,
                "locationType": "AWS Region",
                "operatingSystem": "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
                "marketoption": "OnDemand",
                "licenseModel": "No License required",
                "operation": "RunInstances",
                "usagetype": f"BoxUsage:{itype}",
                "vcpu": f"{vcpus:g}",
                "memory": f"{ram:g} GiB",
                "gpu": str(count),
                "gpuMemory": f"{mem * count:g} GiB" if mem else "NA",
                "currentGeneration": "Yes",
                "processorArchitecture": "64-bit",
            }
            term = {
                "offerTermCode": ON_DEMAND_TERM,
                "sku": sku,
                "effectiveDate": iso(since),
                "termAttributes": {},
                "priceDimensions": {
                    dimension: {
                        "rateCode": dimension,
                        "description": f"${usd.rstrip('0')} per On Demand Linux {itype} "
                        "Instance Hour",
                        "beginRange": "0",
                        "endRange": "Inf",
                        "unit": "Hrs",
                        "pricePerUnit": {"USD": usd},
                        "appliesTo": [],
                    }
                },
            }
            items.append(
                {
                    "product": {
                        "productFamily": "Compute Instance",
                        "attributes": attributes,
                        "sku": sku,
                    },
                    "serviceCode": "AmazonEC2",
                    "terms": {"OnDemand": {f"{sku}.{ON_DEMAND_TERM}": term}},
                    "version": since.strftime("%Y%m%d%H%M%S"),
                    "publicationDate": iso(since),
                }
            )
        return items

    def get_products(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """Serve one Price List API call (only ``GetProducts`` exists here)."""
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target != "AWSPriceListService.GetProducts":
            return pricing_error(
                start_response, "400 Bad Request", "UnknownOperationException", target
            )
        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
        filters = request.get("Filters") or []
        if any(
            f.get("Type") not in ("TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF")
            for f in filters
        ):
            return pricing_error(
                start_response, "400 Bad Request", "InvalidParameterException", "bad filter type"
            )
        limit = int(request.get("MaxResults") or MAX_PRODUCTS)
        if not 1 <= limit <= MAX_PRODUCTS:
            return pricing_error(
                start_response,
                "400 Bad Request",
                "InvalidParameterException",
                f"MaxResults must be within 1..{MAX_PRODUCTS}",
            )
        query = query_key(request.get("ServiceCode"), filters)
        offset = page_offset(request.get("NextToken"), query)
        if offset is None:
            return pricing_error(
                start_response,
                "400 Bad Request",
                "InvalidNextTokenException",
                "The next token is not valid for this request",
            )
        found = []
        if request.get("ServiceCode") == "AmazonEC2":
            for item in self.products():
                fields = {
                    **item["product"]["attributes"],
                    "productFamily": item["product"]["productFamily"],
                    "ServiceCode": item["serviceCode"],
                }
                if all(_matches(fields.get(f["Field"]), f["Type"], f["Value"]) for f in filters):
                    found.append(item)
        page = found[offset : offset + limit]
        body: dict[str, Any] = {
            "FormatVersion": "aws_v1",
            "PriceList": [json.dumps(item) for item in page],
        }
        if offset + limit < len(found):
            body["NextToken"] = page_token(offset + limit, query)
        return respond(start_response, "200 OK", json.dumps(body), _JSON)
