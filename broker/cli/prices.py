"""``broker prices``: the current price of every offer the broker may launch, and its origin."""

from __future__ import annotations

import json
from decimal import Decimal
from enum import StrEnum
from typing import cast

import typer

from broker.cli.api import connect
from broker.cli.output import console, row, table, usd, when
from broker.client import Market as MarketName


class Market(StrEnum):
    spot = "spot"
    on_demand = "on_demand"


def prices(
    gpu: str | None = typer.Option(None, help="Only this GPU type (any case), e.g. A100."),
    provider: str | None = typer.Option(None, help="Only this provider: aws or gcp."),
    region: str | None = typer.Option(None, help="Only this region, e.g. us-east-1."),
    market: Market | None = typer.Option(None, help="Only this market."),
    as_json: bool = typer.Option(False, "--json", help="The prices as one JSON array."),
) -> None:
    """Current prices per offer and market, cheapest first per GPU type; where each came
    from (a cloud's pricing API, or the bundled snapshot) and when it was observed."""
    with connect("team") as api:
        rows = api.prices(gpu, provider, region, cast(MarketName, market.value) if market else None)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    grid = table(
        "GPU",
        "provider",
        "region",
        "zone",
        "instance type",
        "market",
        "$/h",
        "$/GPU-h",
        "observed",
        "source",
        title=f"{len(rows)} prices",
    )
    for p in rows:
        per_gpu = Decimal(p["price_per_hour"]) / max(p["gpu_count"], 1)
        row(
            grid,
            f"{p['gpu']} x{p['gpu_count']}",
            p["provider"],
            p["region"],
            p["zone"],
            p["instance_type"],
            p["market"],
            usd(p["price_per_hour"], 4),
            usd(str(per_gpu), 4),
            when(p["observed_at"]),
            p["source"],
        )
    console().print(grid)
