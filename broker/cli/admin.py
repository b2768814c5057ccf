"""``broker admin``: teams, budgets and keys (``BROKER_API_TOKEN``: the admin token)."""

from __future__ import annotations

from enum import StrEnum
from typing import cast

import typer
from rich.text import Text

from broker.cli.api import connect
from broker.cli.output import console, fields, row, table, usd
from broker.client import Period as PeriodName
from broker.client import Team

admin_app = typer.Typer(
    help="Teams, budgets and keys (BROKER_API_TOKEN: the admin token).", no_args_is_help=True
)
team_app = typer.Typer(help="Create and list teams, change budgets.", no_args_is_help=True)
key_app = typer.Typer(help="Create and revoke team keys.", no_args_is_help=True)
admin_app.add_typer(team_app, name="team")
admin_app.add_typer(key_app, name="key")


class Period(StrEnum):
    month = "month"
    total = "total"


def _print_team(team: Team, verb: str) -> None:
    budget = team["budget"]
    console().print(Text(f"{verb} team {team['id']} ({team['name']})", style="bold"))
    console().print(
        fields(
            ("budget", f"{usd(budget['limit'])} per {budget['period']}"),
            ("spent", usd(budget["spent"])),
            ("reserved", usd(budget["reserved"])),
            ("available", usd(budget["available"])),
            ("alert at", f"{budget['alert_at']:.0%}" + ("  (alert on)" if budget["alert"] else "")),
        )
    )


@team_app.command("create")
def team_create(
    name: str = typer.Argument(..., help="Team name."),
    limit: str = typer.Option(..., help="Budget limit in USD, e.g. 500.00."),
    period: Period = typer.Option(Period.month, help="Budget period: per month, or in total."),
    alert_at: float = typer.Option(0.8, help="Fraction of the budget at which to alert."),
) -> None:
    """Create a team with a budget."""
    with connect("admin") as api:
        _print_team(
            api.create_team(name, limit, cast(PeriodName, period.value), alert_at), "created"
        )


@team_app.command("list")
def team_list() -> None:
    """Every team with its budget figures."""
    with connect("admin") as api:
        teams = api.list_teams()
    grid = table("id", "name", "limit", "period", "spent", "reserved", "available", "alert")
    for team in teams:
        b = team["budget"]
        alert = f"{b['alert_at']:.0%}" + (" ON" if b["alert"] else "")
        row(
            grid,
            team["id"],
            team["name"],
            usd(b["limit"]),
            b["period"],
            usd(b["spent"]),
            usd(b["reserved"]),
            usd(b["available"]),
            alert,
        )
    console().print(grid)


@team_app.command("budget")
def team_budget(
    team_id: str = typer.Argument(..., help="Team id."),
    limit: str | None = typer.Option(None, help="New budget limit in USD."),
    alert_at: float | None = typer.Option(None, help="New alert fraction (0 to 1)."),
    period: Period | None = typer.Option(None, help="New budget period."),
) -> None:
    """Change a team's budget (PATCH /v1/teams/TEAM_ID)."""
    if limit is None and alert_at is None and period is None:
        raise typer.BadParameter("give --limit, --alert-at or --period")
    with connect("admin") as api:
        new_period = cast(PeriodName, period.value) if period else None
        team = api.update_budget(team_id, limit=limit, alert_at=alert_at, period=new_period)
        _print_team(team, "updated")


@key_app.command("create")
def key_create(
    team_id: str = typer.Argument(..., help="Team id."),
    name: str = typer.Option("cli", help="Name of the key."),
) -> None:
    """Create a key for a team and print its token (shown only this once)."""
    with connect("admin") as api:
        key = api.create_key(team_id, name)
    out = console()
    out.print(Text(f"created key {key['id']} ({key['name']}, prefix {key['prefix']})"))
    out.print(Text(f"token: {key['token']}", style="bold"))
    out.print("The token is shown only now; use it as BROKER_API_TOKEN for the team.")


@key_app.command("revoke")
def key_revoke(
    team_id: str = typer.Argument(..., help="Team id."),
    key_id: str = typer.Argument(..., help="Key id."),
) -> None:
    """Revoke a team key; it stops working at once."""
    with connect("admin") as api:
        api.revoke_key(team_id, key_id)
    console().print(Text(f"revoked key {key_id} of team {team_id}"))
