"""``broker admin``, ``quote``, ``jobs`` and ``spend``: the REST API from the command line.

Every command talks to ``BROKER_API_URL`` over HTTP (httpx), never to the database, with
the bearer token in ``BROKER_API_TOKEN``: the admin token for ``broker admin``, a team key
for the others. Register with ``app.add_typer(admin_app, name="admin")``,
``app.add_typer(jobs_app, name="jobs")``, ``app.command("quote")(quote)`` and
``app.command("spend")(spend)``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, NoReturn

import httpx
import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker import clock
from broker.core.job_status import TERMINAL, JobStatus
from broker.settings import Settings, get_settings

admin_app = typer.Typer(
    help="Teams, budgets and keys (BROKER_API_TOKEN: the admin token).", no_args_is_help=True
)
team_app = typer.Typer(help="Create and list teams, change budgets.", no_args_is_help=True)
key_app = typer.Typer(help="Create and revoke team keys.", no_args_is_help=True)
admin_app.add_typer(team_app, name="team")
admin_app.add_typer(key_app, name="key")
jobs_app = typer.Typer(
    help="Submit, list, show, cancel and watch jobs (BROKER_API_TOKEN: a team key).",
    no_args_is_help=True,
)

Kind = Literal["admin", "team"]
TOKEN_OF: dict[Kind, str] = {"admin": "the admin token", "team": "a team key"}
UNFINISHED = [s.value for s in JobStatus if s not in TERMINAL]
SPEC_HELP = (
    "YAML job spec with the fields of POST /v1/jobs (name, workload, resources, deadline, "
    "max_cost, ...). deadline: an ISO time with an offset, or relative to the broker's clock "
    "(as GET /healthz reports it, so a scaled demo clock is honoured) as +8h, +90m, +2d or "
    "+1d12h; max_cost may be a number or a string."
)
JOB_FILE = typer.Argument(..., exists=True, dir_okay=False, readable=True, help=SPEC_HELP)
_RELATIVE = re.compile(r"\+\s*((?:\d+(?:\.\d+)?\s*[smhdw]\s*)+)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Period(StrEnum):
    month = "month"
    total = "total"


class GroupBy(StrEnum):
    day = "day"
    job = "job"
    provider = "provider"


# --- output -------------------------------------------------------------------------------


def _console(stderr: bool = False) -> Console:
    """A console; piped output gets 200 columns so tables are not cut at 80."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=200)


def _fail(message: str) -> NoReturn:
    """Print ``message`` as the command's error and exit 1 (no traceback)."""
    _console(stderr=True).print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
    raise typer.Exit(1)


def _usd(value: str | None, places: int = 2) -> str:
    if value is None:
        return "-"
    try:
        amount = Decimal(value).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
    except InvalidOperation:
        return str(value)
    return f"${amount:,}"


def _when(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return value


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def _plan(plan: dict[str, Any] | None) -> str:
    if not plan:
        return "-"
    return (
        f"{plan['provider']} {plan['zone']} {plan['instance_type']} "
        f"{plan['gpu']} x{plan['gpu_count']} {plan['market']} "
        f"{_usd(plan['price_per_hour'], 4)}/h"
    )


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(title=Text(title) if title else None, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table


def _row(table: Table, *cells: object, **options: Any) -> None:
    # Text cells: API strings are shown as they are, never parsed as Rich markup.
    table.add_row(
        *(c if isinstance(c, Text | ProgressBar) else Text(str(c)) for c in cells), **options
    )


def _fields(*pairs: tuple[str, object]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in pairs:
        grid.add_row(label, Text(str(value)))
    return grid


# --- the API ------------------------------------------------------------------------------


def error_message(response: httpx.Response) -> str:
    """The API's own words for a failed request (API.md's error bodies), on one line."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict) and "message" in detail:
        text = f"{detail['message']} ({detail.get('code', 'error')}, HTTP {status})"
    elif isinstance(detail, list) and detail:
        text = "; ".join(_validation_error(item) for item in detail) + f" (HTTP {status})"
    elif isinstance(detail, str):
        text = f"{detail} (HTTP {status})"
    else:
        text = f"HTTP {status} {response.reason_phrase} from {response.request.url}"
    if status in (401, 403):
        text += "; check BROKER_API_TOKEN (admin commands: the admin token, others: a team key)"
    return text


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = [str(part) for part in item.get("loc", [])]
    if loc[:1] == ["body"]:
        loc = loc[1:]
    return f"{'.'.join(loc) or 'request body'}: {item.get('msg', 'invalid')}"


class Api:
    """An HTTP client on the broker API with a bearer token; any failure ends the command."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def close(self) -> None:
        self._http.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """The status and decoded JSON body of a successful request (None for no body)."""
        try:
            response = self._http.request(method, path, json=body, params=params, headers=headers)
        except httpx.TimeoutException:
            _fail(f"the broker API at {self.base_url} did not answer in time (BROKER_API_URL)")
        except httpx.TransportError as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            _fail(
                f"cannot reach the broker API at {self.base_url} ({reason}); is it running? "
                "Set BROKER_API_URL to its address"
            )
        if response.is_error:
            _fail(error_message(response))
        if not response.content:
            return response.status_code, None
        try:
            return response.status_code, response.json()
        except ValueError:
            _fail(
                f"{response.request.url} answered HTTP {response.status_code} without JSON; "
                "is BROKER_API_URL the broker API?"
            )

    def call(self, method: str, path: str, **options: Any) -> Any:
        """The decoded JSON body of a successful request."""
        return self.send(method, path, **options)[1]

    def server_time(self) -> datetime:
        """The broker's clock as the API reports it (a scaled clock runs ahead of ours)."""
        reported = (self.call("GET", "/healthz") or {}).get("time")
        return datetime.fromisoformat(reported) if reported else clock.now()


def _settings() -> Settings:
    try:
        return get_settings()
    except ValidationError as error:
        _fail(f"invalid BROKER_ setting: {' '.join(str(error).split())}")


@contextmanager
def _api(kind: Kind) -> Iterator[Api]:
    """A client on BROKER_API_URL with BROKER_API_TOKEN, which must be ``kind``'s token."""
    settings = _settings()
    token = settings.api_token.get_secret_value().strip() if settings.api_token else ""
    if not token:
        _fail(f"no API token: set BROKER_API_TOKEN to {TOKEN_OF[kind]}")
    try:
        api = Api(settings.api_url, token)
    except httpx.InvalidURL as error:
        _fail(f"BROKER_API_URL {settings.api_url!r} is not a valid URL: {error}")
    try:
        yield api
    finally:
        api.close()


# --- job specs ----------------------------------------------------------------------------


def relative_time(text: str, now: datetime) -> datetime | None:
    """``now`` plus a span like ``+8h``, ``+90m`` or ``+1d12h``; None if ``text`` is not one."""
    match = _RELATIVE.fullmatch(text.strip())
    if match is None:
        return None
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw])", match.group(1))
    return now + timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, date):  # YAML reads unquoted timestamps as datetimes
        return value.isoformat()
    return value


def load_spec(path: Path, now: Callable[[], datetime] | None = None) -> dict[str, Any]:
    """The job spec in a YAML file as the API's JSON body (relative deadline resolved).

    ``now`` gives the broker's time for a relative deadline (default: this process's clock).
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        _fail(f"cannot read {path}: {error.strerror or error}")
    except yaml.YAMLError as error:
        _fail(f"{path} is not valid YAML: {' '.join(str(error).split())}")
    if not isinstance(data, dict):
        _fail(f"{path} must be a mapping of job spec fields (name, workload, resources, ...)")
    deadline = data.get("deadline")
    if isinstance(deadline, str) and deadline.strip().startswith("+"):
        moment = relative_time(deadline, (now or clock.now)())
        if moment is None:
            _fail(f"deadline {deadline!r} in {path}: use an ISO time or a span like +8h, +2d")
        data["deadline"] = moment.isoformat()
    cost = data.get("max_cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        data["max_cost"] = str(Decimal(repr(cost)))  # the API takes money as strings only
    return _jsonable(data)


# --- admin --------------------------------------------------------------------------------


def _print_team(team: dict[str, Any], verb: str) -> None:
    budget = team["budget"]
    _console().print(Text(f"{verb} team {team['id']} ({team['name']})", style="bold"))
    _console().print(
        _fields(
            ("budget", f"{_usd(budget['limit'])} per {budget['period']}"),
            ("spent", _usd(budget["spent"])),
            ("reserved", _usd(budget["reserved"])),
            ("available", _usd(budget["available"])),
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
    body = {"name": name, "budget": {"limit": limit, "period": period.value, "alert_at": alert_at}}
    with _api("admin") as api:
        _print_team(api.call("POST", "/v1/teams", body=body), "created")


@team_app.command("list")
def team_list() -> None:
    """Every team with its budget figures."""
    with _api("admin") as api:
        teams = api.call("GET", "/v1/teams")
    table = _table("id", "name", "limit", "period", "spent", "reserved", "available", "alert")
    for team in teams:
        b = team["budget"]
        alert = f"{b['alert_at']:.0%}" + (" ON" if b["alert"] else "")
        _row(
            table,
            team["id"],
            team["name"],
            _usd(b["limit"]),
            b["period"],
            _usd(b["spent"]),
            _usd(b["reserved"]),
            _usd(b["available"]),
            alert,
        )
    _console().print(table)


@team_app.command("budget")
def team_budget(
    team_id: str = typer.Argument(..., help="Team id."),
    limit: str | None = typer.Option(None, help="New budget limit in USD."),
    alert_at: float | None = typer.Option(None, help="New alert fraction (0 to 1)."),
    period: Period | None = typer.Option(None, help="New budget period."),
) -> None:
    """Change a team's budget (PATCH /v1/teams/TEAM_ID)."""
    budget = {"limit": limit, "alert_at": alert_at, "period": period.value if period else None}
    budget = {k: v for k, v in budget.items() if v is not None}
    if not budget:
        raise typer.BadParameter("give --limit, --alert-at or --period")
    with _api("admin") as api:
        _print_team(api.call("PATCH", f"/v1/teams/{team_id}", body={"budget": budget}), "updated")


@key_app.command("create")
def key_create(
    team_id: str = typer.Argument(..., help="Team id."),
    name: str = typer.Option("cli", help="Name of the key."),
) -> None:
    """Create a key for a team and print its token (shown only this once)."""
    with _api("admin") as api:
        key = api.call("POST", f"/v1/teams/{team_id}/keys", body={"name": name})
    console = _console()
    console.print(Text(f"created key {key['id']} ({key['name']}, prefix {key['prefix']})"))
    console.print(Text(f"token: {key['token']}", style="bold"))
    console.print("The token is shown only now; use it as BROKER_API_TOKEN for the team.")


@key_app.command("revoke")
def key_revoke(
    team_id: str = typer.Argument(..., help="Team id."),
    key_id: str = typer.Argument(..., help="Key id."),
) -> None:
    """Revoke a team key; it stops working at once."""
    with _api("admin") as api:
        api.call("DELETE", f"/v1/teams/{team_id}/keys/{key_id}")
    _console().print(Text(f"revoked key {key_id} of team {team_id}"))


# --- quotes and jobs ----------------------------------------------------------------------


def quote(job_file: Path = JOB_FILE) -> None:
    """Ranked plans for a job spec, cheapest expected cost first; launches nothing."""
    with _api("team") as api:
        spec = load_spec(job_file, api.server_time)
        result = api.call("POST", "/v1/quotes", body=spec)
    table = _table(
        "#",
        "provider",
        "zone",
        "instance type",
        "GPU",
        "market",
        "$/h",
        "exp. hours",
        "exp. cost",
        "worst case",
        "p_deadline",
        title=f"Plans for {spec.get('name', job_file.name)}",
    )
    for rank, p in enumerate(result["plans"], 1):
        _row(
            table,
            rank,
            p["provider"],
            p["zone"],
            p["instance_type"],
            f"{p['gpu']} x{p['gpu_count']}",
            p["market"],
            _usd(p["price_per_hour"], 4),
            f"{p['expected_hours']:.2f}",
            _usd(p["expected_cost"]),
            _usd(p["worst_case_cost"]),
            f"{p['p_deadline']:.1%}",
        )
    console = _console()
    console.print(table)
    cheapest = result.get("cheapest_on_demand")
    if cheapest:
        console.print(
            Text(
                f"cheapest on-demand: {_plan(cheapest)}, expected {_usd(cheapest['expected_cost'])}"
            )
        )


@jobs_app.command("submit")
def jobs_submit(
    job_file: Path = JOB_FILE,
    idempotency_key: str | None = typer.Option(
        None, help="Submitting again with the same key and spec returns the same job."
    ),
) -> None:
    """Submit a job: the broker reserves its worst-case cost and launches the best plan."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with _api("team") as api:
        spec = load_spec(job_file, api.server_time)
        status, job = api.send("POST", "/v1/jobs", body=spec, headers=headers)
    console = _console()
    if status == 200:
        console.print(Text(f"job {job['id']} was already submitted with this idempotency key"))
    else:
        console.print(Text(f"submitted job {job['id']} ({job['name']})", style="bold"))
    console.print(
        _fields(
            ("id", job["id"]),
            ("status", job["status"]),
            ("plan", _plan(job["plan"])),
            ("reserved", _usd(job["reserved"])),
            ("max cost", _usd(job["max_cost"])),
            ("deadline", _when(job["deadline"])),
        )
    )


def _jobs(api: Api, status: str | None, page_size: int = 100) -> list[dict[str, Any]]:
    """Every job of the team (with ``status``), following next_cursor, newest first."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": page_size}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        page = api.call("GET", "/v1/jobs", params=params)
        items.extend(page["items"])
        if not page.get("next_cursor") or page["next_cursor"] == cursor:
            return items
        cursor = page["next_cursor"]


@jobs_app.command("list")
def jobs_list(
    status: str | None = typer.Option(
        None, help=f"Only jobs in this status ({', '.join(JobStatus)})."
    ),
    page_size: int = typer.Option(100, min=1, max=100, help="Jobs fetched per request."),
) -> None:
    """The team's jobs, newest first (every page)."""
    with _api("team") as api:
        jobs = _jobs(api, status, page_size)
    table = _table("id", "name", "status", "done", "plan", "max cost", "deadline", "created")
    for job in jobs:
        _row(
            table,
            job["id"],
            job["name"],
            job["status"],
            f"{job['progress']['fraction']:.1%}",
            _plan(job["plan"]),
            _usd(job["max_cost"]),
            _when(job["deadline"]),
            _when(job["created_at"]),
        )
    table.caption = f"{len(jobs)} job(s)"
    _console().print(table)


@jobs_app.command("show")
def jobs_show(job_id: str = typer.Argument(..., help="Job id.")) -> None:
    """A job's details, its attempts and its checkpoints."""
    with _api("team") as api:
        job = api.call("GET", f"/v1/jobs/{job_id}")
    progress = job["progress"]
    checkpoints = job["checkpoints"]
    latest = max(checkpoints, key=lambda c: c["work_done"], default=None)
    console = _console()
    console.print(Text(f"job {job['id']} ({job['name']})", style="bold"))
    console.print(
        _fields(
            (
                "status",
                job["status"] + (f" ({job['status_reason']})" if job["status_reason"] else ""),
            ),
            ("plan", _plan(job["plan"])),
            (
                "progress",
                f"{progress['work_done']:,.0f} / {progress['total_work']:,.0f} "
                f"({progress['fraction']:.1%}), checkpointed {progress['checkpointed_work']:,.0f}",
            ),
            ("spent", _usd(job["spent"])),
            ("reserved", _usd(job["reserved"])),
            ("max cost", _usd(job["max_cost"])),
            ("deadline", _when(job["deadline"])),
            ("created", _when(job["created_at"])),
            ("finished", _when(job["finished_at"])),
            (
                "checkpoints",
                f"{len(checkpoints)}"
                + (
                    f" (latest at {latest['work_done']:,.0f}: {latest['object_key']})"
                    if latest
                    else ""
                ),
            ),
        )
    )
    table = _table(
        "attempt",
        "provider",
        "zone",
        "instance type",
        "market",
        "$/h",
        "status",
        "started",
        "ended",
        "end reason",
        "work done",
        "cost",
        title="Attempts",
    )
    for a in job["attempts"]:
        _row(
            table,
            a["id"],
            a["provider"],
            a["zone"],
            a["instance_type"],
            a["market"],
            _usd(a["price_per_hour"], 4),
            a["status"],
            _when(a["started_at"]),
            _when(a["ended_at"]),
            a["end_reason"] or "-",
            f"{a['work_done']:,.0f}",
            _usd(a["cost"]),
        )
    console.print(table if job["attempts"] else Text("no attempts yet"))


@jobs_app.command("cancel")
def jobs_cancel(job_id: str = typer.Argument(..., help="Job id.")) -> None:
    """Cancel a job: its instances are terminated and its spend settled."""
    with _api("team") as api:
        job = api.call("POST", f"/v1/jobs/{job_id}/cancel")
    _console().print(
        Text(f"job {job['id']} ({job['name']}): {job['status']}, spent {_usd(job['spent'])}")
    )


class _Eta:
    """Time left from the work rate seen since the watch began (reset when work goes back)."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None

    def __call__(self, moment: float, done: float, total: float) -> str:
        if self.first is None or done < self.first[1]:
            self.first = (moment, done)
        started, done_then = self.first
        if moment <= started or done <= done_then:
            return "-"
        rate = (done - done_then) / (moment - started)
        return _duration((total - done) / rate)


def _watch_table(jobs: list[dict[str, Any]], etas: dict[str, _Eta], moment: float) -> Table:
    table = _table("job", "name", "status", "progress", "work done", "spent", "ETA")
    for job in jobs:
        p = job["progress"]
        total = p["total_work"] or 1.0
        done = min(p["work_done"], total)
        eta = "-" if job["status"] in TERMINAL else etas[job["id"]](moment, done, total)
        _row(
            table,
            job["id"],
            job["name"],
            job["status"],
            ProgressBar(total=total, completed=done, width=30),
            f"{done:,.0f} / {total:,.0f}",
            _usd(job["spent"]),
            eta,
        )
    return table


@jobs_app.command("watch")
def jobs_watch(
    job_ids: list[str] | None = typer.Argument(None, help="Job ids; default: unfinished jobs."),
    interval: float = typer.Option(2.0, min=0.05, help="Seconds between refreshes."),
) -> None:
    """Live progress of jobs until every one is finished (succeeded, failed, cancelled,
    budget_exhausted or deadline_missed). ETA from the work rate seen while watching."""
    console = _console()
    with _api("team") as api:
        ids = list(job_ids or [])
        if not ids:
            ids = [j["id"] for s in UNFINISHED for j in _jobs(api, s)]
            if not ids:
                console.print("no unfinished jobs to watch")
                return
        etas = {job_id: _Eta() for job_id in ids}
        try:
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    jobs = [api.call("GET", f"/v1/jobs/{job_id}") for job_id in ids]
                    live.update(_watch_table(jobs, etas, time.monotonic()), refresh=True)
                    if all(job["status"] in TERMINAL for job in jobs):
                        break
                    time.sleep(interval)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    if not console.is_terminal:
        console.line()  # Live ends its last frame with a newline only on a terminal
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    console.print(f"all {len(jobs)} finished: " + ", ".join(f"{n} {s}" for s, n in counts.items()))


# --- spend --------------------------------------------------------------------------------


def spend(
    by: GroupBy = typer.Option(GroupBy.day, help="Group spend by day, job or provider."),
    start: str | None = typer.Option(
        None, help="From this ISO time (inclusive), e.g. 2026-12-01T00:00:00Z."
    ),
    end: str | None = typer.Option(None, help="Until this ISO time (exclusive)."),
) -> None:
    """The team's spend, grouped, with a total."""
    params = {"group_by": by.value, "start": start, "end": end}
    with _api("team") as api:
        report = api.call("GET", "/v1/spend", params={k: v for k, v in params.items() if v})
    table = Table(show_footer=True)
    table.add_column(by.value, footer=Text("total", style="bold"), no_wrap=True)
    table.add_column("amount", footer=Text(_usd(report["total"]), style="bold"), justify="right")
    for row in report["rows"]:
        _row(table, row["key"], _usd(row["amount"]))
    _console().print(table)
