"""Team routes: the team's budget and its spend report."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from broker.api.deps import NowDep, SessionDep, SessionRoute, TeamDep
from broker.api.errors import error_responses
from broker.api.present import budget_out, spend_out
from broker.api.schemas import BudgetOut, SpendOut
from broker.services import teams
from broker.services.job_spec import Time
from broker.services.ledger import spend_report

router = APIRouter(
    prefix="/v1", tags=["budget"], responses=error_responses(401, 403), route_class=SessionRoute
)


@router.get("/budget", response_model=BudgetOut)
def get_budget(session: SessionDep, now: NowDep, team_id: TeamDep) -> BudgetOut:
    _, figures = teams.budget_of(session, team_id, now)
    return budget_out(figures)


@router.get("/spend", response_model=SpendOut)
def get_spend(
    session: SessionDep,
    team_id: TeamDep,
    start: Annotated[Time | None, Query()] = None,
    end: Annotated[Time | None, Query()] = None,
    group_by: Annotated[Literal["day", "job", "provider"], Query()] = "day",
) -> SpendOut:
    return spend_out(spend_report(session, team_id, start, end, group_by))
