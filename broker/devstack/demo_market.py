"""What the demo does to the local market while its jobs run: a spot outage in the busiest
zone, and a staged spot price rise there that the price refresh carries to every process."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Any

from broker.core.money import to_micros

RISE = Decimal("1.5")  # the staged spot price rise: x1.5


def _busiest_spot_plan(rows: dict[str, dict]) -> dict | None:
    """The spot plan (provider, region, zone, instance type) most jobs plan on."""
    plans = Counter(
        (p["provider"], p["region"], p["zone"], p["instance_type"], p["gpu"], p["price_per_hour"])
        for row in rows.values()
        if (p := row.get("plan") or {}).get("market") == "spot"
    )
    if not plans:
        return None
    provider, region, zone, instance_type, gpu, price = plans.most_common(1)[0][0]
    return {
        "provider": provider,
        "region": region,
        "zone": zone,
        "instance_type": instance_type,
        "gpu": gpu,
        "price_per_hour": price,
    }


def _zone_name(provider: str, region: str, zone: str) -> str:
    """The name the local cloud knows a plan's zone by (AWS plans name zone ids)."""
    if provider != "aws":
        return zone
    from broker.settings import get_settings
    from providers.aws import AwsProvider

    return AwsProvider.from_settings(get_settings()).resolve_zone(region, zone)


def outage(stack: Any, rows: dict[str, dict]) -> str | None:
    """Take spot away in the zone most running spot jobs use (as a real outage would)."""
    zones = Counter(
        (p["provider"], p["region"], p["zone"])
        for row in rows.values()
        if row["status"] == "running" and (p := row.get("plan") or {}).get("market") == "spot"
    )
    if not zones:
        return None
    provider, region, zone = zones.most_common(1)[0][0]
    stack.cloud.market.set_available(provider, _zone_name(provider, region, zone), "*", False)
    return f"{provider} {zone}"


def stage_price_rise(stack: Any, rows: dict[str, dict], at: datetime) -> str | None:
    """Stage a x1.5 spot price rise at ``at`` on the offer most spot jobs use; the local
    cloud's pricing APIs serve it from then, and the broker's refresh stores it."""
    plan = _busiest_spot_plan(rows)
    if plan is None:
        return None
    old = Decimal(plan["price_per_hour"])
    new = (old * RISE).quantize(Decimal("0.0001"))
    stack.cloud.market.stage_price(
        at,
        plan["provider"],
        plan["zone"],
        plan["instance_type"],
        "spot",
        to_micros(new),
        gpu=plan["gpu"],
    )
    return (
        f"{plan['provider']} {plan['zone']} {plan['instance_type']} spot ${old}/h -> ${new}/h "
        f"at {at:%H:%M} broker time"
    )
