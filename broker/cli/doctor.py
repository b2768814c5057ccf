"""``broker doctor``: check what the broker relies on; exit 1 when anything is broken."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from broker.cli.output import console
from broker.services.doctor import Check, run_checks
from broker.settings import get_settings

_STYLES = {"ok": "green", "fail": "bold red", "skip": "dim"}


def doctor(
    timeout: float = typer.Option(5.0, min=0.1, help="Seconds each network check may take."),
) -> None:
    """Check the database, the task queue and both clouds; say how to fix what is broken."""
    checks = run_checks(get_settings(), timeout=timeout)
    console().print(checks_table(checks))
    broken = [c for c in checks if c.failed]
    if broken:
        console(stderr=True).print(
            Text(f"{len(broken)} check(s) failed; see the fix column.", style="bold red")
        )
        raise typer.Exit(1)


def checks_table(checks: list[Check]) -> Table:
    """One row per check: its name, status, what was found and, when it failed, the fix."""
    grid = Table(title=Text("broker doctor"), title_justify="left")
    grid.add_column("check", no_wrap=True)
    grid.add_column("status", no_wrap=True)
    grid.add_column("found")
    grid.add_column("fix")
    for check in checks:
        grid.add_row(
            Text(check.name),
            Text(check.status, style=_STYLES[check.status]),
            Text(check.detail),
            Text(check.fix),
        )
    return grid
