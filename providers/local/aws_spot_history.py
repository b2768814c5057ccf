"""EC2's ``DescribeSpotPriceHistory`` for the local AWS (moto answers every price as
0.00001): the bundled catalog's spot price per (instance type, zone) from the market's start,
then each change the market replay made to it, as EC2's query API answers (XML, newest
first, ``StartTime``/``EndTime``, filters, ``MaxResults``/``NextToken``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from xml.sax.saxutils import escape

from broker.core.money import from_micros
from broker.core.offers import NO_PRICE
from providers.local.aws_pricing import AwsPrices, StartResponse, iso, respond
from providers.local.paging import page_offset, page_token, query_key

SPOT_PRODUCT = "Linux/UNIX"
MAX_SPOT_ITEMS = 1000


def _ec2_error(start_response: StartResponse, code: str, message: str) -> list[bytes]:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return respond(start_response, "400 Bad Request", body, "text/xml")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def spot_history(
    prices: AwsPrices, region: str
) -> dict[tuple[str, str], list[tuple[datetime, int]]]:
    """(since, micros) changes, oldest first, by (instance type, zone name) of a region;
    a key whose newest change is ``NO_PRICE`` is left out."""
    t = prices.catalog
    history: dict[tuple[str, str], list[tuple[datetime, int]]] = {}
    for zone_id, instance_type, price in zip(
        t.zone.tolist(),
        t.instance_type.tolist(),
        t.spot_micros_per_hour.tolist(),
        strict=True,
    ):
        zone = prices.zones.get(zone_id)
        if zone is not None and zone.region == region and price != NO_PRICE:
            history[instance_type, zone.name] = [(prices.start(), int(price))]
    for change in prices.changes("spot"):
        zone = prices.zones.get(change.zone)
        if zone is not None and zone.region == region:
            key = (change.instance_type, zone.name)
            history.setdefault(key, []).append((change.effective_at, change.micros_per_hour))
    return {
        key: [entry for entry in entries if entry[1] != NO_PRICE]
        for key, entries in history.items()
        if entries[-1][1] != NO_PRICE
    }


def describe_spot_price_history(
    prices: AwsPrices, params: dict[str, str], region: str, start_response: StartResponse
) -> list[bytes]:
    """Serve ``DescribeSpotPriceHistory`` for ``region``: every price in effect between
    StartTime (the one in effect then included) and EndTime (default: now), newest
    first, filtered by instance type, product description and zone."""

    def listed(prefix: str) -> set[str]:
        return {v for k, v in params.items() if k.startswith(prefix + ".")}

    filters: dict[str, set[str]] = {}
    for key, name in params.items():
        if key.startswith("Filter.") and key.endswith(".Name"):
            filters[name] = listed(key.removesuffix(".Name") + ".Value")
    types = listed("InstanceType") | filters.get("instance-type", set())
    products = listed("ProductDescription") | filters.get("product-description", set())
    names = filters.get("availability-zone", set()) | (
        {params["AvailabilityZone"]} if "AvailabilityZone" in params else set()
    )
    ids = filters.get("availability-zone-id", set()) | (
        {params["AvailabilityZoneId"]} if "AvailabilityZoneId" in params else set()
    )
    try:
        start = _parse_time(params.get("StartTime"))
        end = _parse_time(params.get("EndTime")) or (
            prices.market.now() if prices.market else datetime.now(UTC)
        )
    except ValueError as exc:
        return _ec2_error(start_response, "InvalidParameterValue", str(exc))
    items = []
    if not products or SPOT_PRODUCT in products:
        for (itype, zone_name), entries in spot_history(prices, region).items():
            zone = prices.zones[zone_name]
            if (types and itype not in types) or (names and zone_name not in names):
                continue
            if ids and zone.zone_id not in ids:
                continue
            until_end = [e for e in entries if e[0] <= end]
            before = [e for e in until_end if start is not None and e[0] < start]
            shown = before[-1:] + [e for e in until_end if start is None or e[0] >= start]
            items += [(at, seq, micros, itype, zone) for seq, (at, micros) in enumerate(shown)]
    # Newest first; of two changes at one time, the later given is the newer.
    items.sort(key=lambda item: (item[0], item[1], item[3], item[4].name), reverse=True)
    query = query_key(
        sorted((k, v) for k, v in params.items() if k not in ("NextToken", "MaxResults"))
    )
    offset = page_offset(params.get("NextToken"), query)
    if offset is None:
        return _ec2_error(start_response, "InvalidNextToken", "The token is not valid")
    limit = int(params.get("MaxResults") or MAX_SPOT_ITEMS)
    rows = "".join(
        f"<item><instanceType>{itype}</instanceType>"
        f"<productDescription>{SPOT_PRODUCT}</productDescription>"
        f"<spotPrice>{from_micros(micros):.6f}</spotPrice><timestamp>{iso(at)}</timestamp>"
        f"<availabilityZone>{zone.name}</availabilityZone>"
        f"<availabilityZoneId>{zone.zone_id}</availabilityZoneId></item>"
        for at, _, micros, itype, zone in items[offset : offset + limit]
    )
    more = offset + limit < len(items)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPriceHistorySet>{rows}"
        f"</spotPriceHistorySet><nextToken>{page_token(offset + limit, query) if more else ''}"
        "</nextToken></DescribeSpotPriceHistoryResponse>"
    )
    return respond(start_response, "200 OK", body, "text/xml")
