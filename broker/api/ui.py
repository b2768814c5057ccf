"""The dashboard at ``/ui``: server-rendered pages (Jinja2) with Chart.js charts.

Logging in with a team key shows that team; the admin token shows every team. The browser
keeps a signed session (never the token) in an HttpOnly, SameSite=Strict cookie scoped to
``/ui``, checked on every page against the key it names (a revoked key stops working at once);
``ui_security`` holds the session, origin and header rules.
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from broker.api import ui_security
from broker.api.deps import NowDep, SessionDep, SessionRoute
from broker.core.job_status import is_terminal
from broker.db.models import Team
from broker.services import agent_channel, dashboard, job_logs
from broker.services.plans import ChosenPlan, job_plan
from broker.services.quoting import get_planning
from broker.services.teams import Principal
from providers.base import ProviderError
from providers.storage import S3CheckpointStore

BASE = "/ui"
COOKIE = ui_security.COOKIE
HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
static = StaticFiles(directory=str(HERE / "static"))
router = APIRouter(prefix=BASE, include_in_schema=False, route_class=SessionRoute)
REFRESH_SECONDS = 5
LOG_LINES = 50
StoreDep = Annotated[S3CheckpointStore, Depends(agent_channel.get_store)]


def _principal(session: Any, cookie: str | None) -> Principal | None:
    return ui_security.principal_of(session, cookie)


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(
        request, name, {"base": BASE, "static_url": f"{BASE}/static", **context}
    )


def _viewer(principal: Principal, teams: list[Team]) -> str:
    """Who the page is for, as its header says."""
    return "admin (all teams)" if principal.is_admin else f"team {teams[0].name}"


def _to_login() -> RedirectResponse:
    return RedirectResponse(f"{BASE}/login", status_code=303)


def _plan_label(plan: ChosenPlan | None) -> str:
    if plan is None:
        return "–"
    shape = _shape(plan.nodes, plan.gpu_count, plan.gpu)
    return f"{shape} {plan.market} {plan.provider}/{plan.zone}"


def _shape(nodes: int, gpu_count: int, gpu: str) -> str:
    """``2xV100``, or a gang's ``2 nodes x 8xV100``."""
    one = f"{gpu_count}x{gpu}"
    return f"{nodes} nodes x {one}" if nodes > 1 else one


def format_usd(micros: int) -> str:
    """Dollars and cents for people (the API keeps micro-dollars exact)."""
    return f"{(Decimal(micros) / 1_000_000).quantize(Decimal('0.01'), ROUND_HALF_UP):,}"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "–"


TokenCookie = Annotated[str | None, Cookie(alias=COOKIE)]  # the signed session, not a token


def _cross_site() -> HTMLResponse:
    return HTMLResponse("<h1>Cross-site request refused</h1>", status_code=403)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    return _page(request, "login.html")


@router.post("/login")
def login(
    request: Request, session: SessionDep, token: Annotated[str, Form(max_length=200)]
) -> Response:
    if not ui_security.same_origin(request):
        return _cross_site()
    cookie = ui_security.sign_in(session, token.strip())
    if cookie is None:
        return _page(request, "login.html", error="unknown or revoked token")
    response = RedirectResponse(f"{BASE}/", status_code=303)
    ui_security.set_session(response, request, cookie, BASE)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    if not ui_security.same_origin(request):
        return _cross_site()
    response = _to_login()
    response.delete_cookie(COOKIE, path=BASE)
    return response


@router.get("/", response_class=HTMLResponse)
def overview(
    request: Request, session: SessionDep, now: NowDep, token: TokenCookie = None
) -> Response:
    principal = _principal(session, token)
    if principal is None:
        return _to_login()
    teams = dashboard.visible_teams(session, principal.team_id)
    names = {t.id: t.name for t in teams}
    budgets = dashboard.budgets(session, teams, now)
    rows = dashboard.jobs(session, teams)
    series = dashboard.spend_series(session, teams, now)
    planning = get_planning()
    planning.sync(session)
    prices = dashboard.price_chart(planning.offers)
    budget_view = [
        {
            "name": b.team.name,
            "spent": format_usd(b.figures.spent),
            "reserved": format_usd(b.figures.reserved),
            "left": format_usd(b.figures.available),
            "limit": format_usd(b.figures.limit),
            "alert": b.figures.alert,
        }
        for b in budgets
    ]
    jobs = []
    for row in rows:
        job = row.job
        jobs.append(
            {
                "id": job.id,
                "name": job.name,
                "team": names.get(job.team_id, ""),
                "status": job.status,
                "fraction": min(job.work_done / job.total_work, 1.0) if job.total_work else 0.0,
                "plan": _plan_label(job_plan(job)),
                "spent": format_usd(row.spent_micros),
                "on_demand": format_usd(job.on_demand_only_micros)
                if job.on_demand_only_micros is not None
                else None,
                "deadline": _when(job.deadline),
                "deadline_met": row.deadline_met,
            }
        )
    chart_data = {
        "budgets": [
            {
                "spent": b.figures.spent,
                "reserved": b.figures.reserved,
                "left": b.figures.available,
                "alert": b.figures.alert,
            }
            for b in budgets
        ],
        "spend": {
            "labels": series.labels,
            "by_team": series.by_team,
            "by_provider": series.by_provider,
        },
        "prices": [{"labels": p.places, "spot": p.spot, "on_demand": p.on_demand} for p in prices],
    }
    unfinished = any(not is_terminal(r.job.status) for r in rows)
    return _page(
        request,
        "overview.html",
        viewer=_viewer(principal, teams),
        budgets=budget_view,
        jobs=jobs,
        prices=[
            {
                "gpu": p.gpu,
                "source": f"observed up to {_when(p.observed_at)} UTC"
                if p.observed_at
                else "bundled snapshot",
            }
            for p in prices
        ],
        chart_data=chart_data,
        refresh=REFRESH_SECONDS if unfinished else None,
    )


def _log_view(session: Any, store: S3CheckpointStore, job_id: str) -> dict[str, str | None]:
    """The last lines of the latest attempt's output that has any (the template escapes it)."""
    try:
        latest = job_logs.latest_log(session, store, job_id, LOG_LINES)
    except ProviderError:
        return {"title": None, "text": None, "note": "log unavailable: the store did not answer"}
    if latest is None:
        return {"title": None, "text": None, "note": "no log yet"}
    attempt, text = latest
    title = f"attempt {attempt.id} ({attempt.zone}, {attempt.market}), last {LOG_LINES} lines"
    return {"title": title, "text": text, "note": None}


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    job_id: str,
    request: Request,
    session: SessionDep,
    now: NowDep,
    store: StoreDep,
    token: TokenCookie = None,
) -> Response:
    principal = _principal(session, token)
    if principal is None:
        return _to_login()
    teams = dashboard.visible_teams(session, principal.team_id)
    history = dashboard.job_history(session, teams, job_id[:64], now)
    if history is None:
        return HTMLResponse("<h1>Not found</h1>", status_code=404)
    job = history.job
    attempts = [
        {
            "where": f"{_shape(s.attempt.nodes, s.attempt.gpu_count, s.attempt.gpu)} "
            f"{s.attempt.provider}/{s.attempt.zone}",
            "market": s.attempt.market,
            "price": format_usd(s.attempt.price_micros_per_hour),
            "start": _when(s.attempt.started_at),
            "end": _when(s.attempt.ended_at),
            "reason": s.attempt.end_reason or s.attempt.status,
            "cost": format_usd(s.attempt.cost_micros),
        }
        for s in history.segments
    ]
    chart_data = {
        "segments": [
            {
                "where": f"{s.attempt.market} {s.attempt.zone}",
                "market": s.attempt.market,
                "reason": s.attempt.end_reason,
                "start": round(s.start_hours, 4),
                "end": round(s.end_hours, 4),
            }
            for s in history.segments
        ],
        "checkpoints": [[round(h, 4), w] for h, w in history.checkpoints],
        "spend_curve": [[round(h, 4), m] for h, m in history.spend_curve],
    }
    view = {
        "name": job.name,
        "status": job.status,
        "reason": job.status_reason,
        "fraction": min(job.work_done / job.total_work, 1.0) if job.total_work else 0.0,
        "work_done": f"{job.work_done:,.2f}",
        "total_work": f"{job.total_work:,.2f}",
        "spent": format_usd(history.spent_micros),
        "max_cost": format_usd(job.max_cost_micros),
        "on_demand": format_usd(job.on_demand_only_micros)
        if job.on_demand_only_micros is not None
        else None,
        "deadline": _when(job.deadline),
        "deadline_met": history.deadline_met,
        "completed_at": _when(job.completed_at) if job.completed_at else None,
        "saved": None if history.saved_micros is None else format_usd(history.saved_micros),
    }
    return _page(
        request,
        "job.html",
        viewer=_viewer(principal, teams),
        job=view,
        attempts=attempts,
        log=_log_view(session, store, job.id),
        chart_data=chart_data,
        refresh=None if is_terminal(job.status) else REFRESH_SECONDS,
    )
