"""``broker spend``: the team's spend, grouped by day, job or provider, with a total."""

from __future__ import annotations

from enum import StrEnum
from typing import cast

import typer
from rich.table import Table
from rich.text import Text

from broker.cli.api import connect
from broker.cli.output import console, row, usd
from broker.client import GroupBy as GroupByName


class GroupBy(StrEnum):
    day = "day"
    job = "job"
    provider = "provider"


def spend(
    by: GroupBy = typer.Option(GroupBy.day, help="Group spend by day, job or provider."),
    start: str | None = typer.Option(
        None, help="From this ISO time (inclusive), e.g. 2026-12-01T00:00:00Z."
    ),
    end: str | None = typer.Option(None, help="Until this ISO time (exclusive)."),
) -> None:
    """The team's spend, grouped, with a total."""
    with connect("team") as api:
        report = api.spend(cast(GroupByName, by.value), start or None, end or None)
    grid = Table(show_footer=True)
    grid.add_column(by.value, footer=Text("total", style="bold"), no_wrap=True)
    grid.add_column("amount", footer=Text(usd(report["total"]), style="bold"), justify="right")
    for line in report["rows"]:
        row(grid, line["key"], usd(line["amount"]))
    console().print(grid)
