"""What the client commands print: Rich consoles and tables, and money, times and plans
formatted for people. API strings are shown as they are, never parsed as Rich markup."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def console(stderr: bool = False) -> Console:
    """A console; piped output gets 200 columns so tables are not cut at 80."""
    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=200)


def fail(message: str) -> NoReturn:
    """Print ``message`` as the command's error and exit 1 (no traceback)."""
    console(stderr=True).print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
    raise typer.Exit(1)


def usd(value: str | None, places: int = 2) -> str:
    """A decimal string of USD as ``$1,234.50`` (``-`` for none)."""
    if value is None:
        return "-"
    try:
        amount = Decimal(value).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
    except InvalidOperation:
        return str(value)
    return f"${amount:,}"


def met(value: bool | None) -> str:
    """A job's ``deadline_met``: ``met``, ``missed``, or ``-`` while it runs."""
    return "-" if value is None else ("met" if value else "missed")


def saving(saved: str | None, against: str | None) -> str:
    """What a job saved against its on-demand-only cost: ``$1.20 (12%)``, negative when it
    cost more (``-`` while it runs)."""
    if saved is None or not against:
        return "-"
    base = Decimal(against)
    share = f" ({Decimal(saved) / base:.0%})" if base > 0 else ""
    return usd(saved) + share


def when(value: str | None) -> str:
    """An ISO time from the API as ``2026-12-05 12:00 UTC`` (``-`` for none)."""
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return value


def duration(seconds: float) -> str:
    """A duration as ``1d02h``, ``3h05m`` or ``4m09s``."""
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def plan(p: Mapping[str, Any] | None) -> str:
    """A plan (or an attempt's offer) on one line; a gang's as ``4 x <instance type>``
    with its total GPUs and whole price."""
    if not p:
        return "-"
    nodes = int(p.get("nodes") or 1)
    machines = f"{nodes} x {p['instance_type']}" if nodes > 1 else p["instance_type"]
    gpus = f"{p['gpu']} x{p['gpu_count']}" + (
        f" ({nodes * p['gpu_count']} GPUs)" if nodes > 1 else ""
    )
    return (
        f"{p['provider']} {p['zone']} {machines} {gpus} {p['market']} "
        f"{usd(p['price_per_hour'], 4)}/h"
    )


def table(*columns: str, title: str | None = None) -> Table:
    """A table with these columns, none wrapped."""
    grid = Table(title=Text(title) if title else None, title_justify="left")
    for column in columns:
        grid.add_column(column, no_wrap=True)
    return grid


def row(grid: Table, *cells: object, **options: Any) -> None:
    """Add a row of cells shown as text (progress bars and Text as they are)."""
    grid.add_row(
        *(c if isinstance(c, Text | ProgressBar) else Text(str(c)) for c in cells), **options
    )


def fields(*pairs: tuple[str, object]) -> Table:
    """Label / value pairs, the labels in bold."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in pairs:
        grid.add_row(label, Text(str(value)))
    return grid
