"""Admin routes: teams, budgets, keys."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from broker.api.deps import AdminDep, NowDep, SessionDep, SessionRoute
from broker.api.errors import error_responses
from broker.api.present import team_out
from broker.api.schemas import KeyCreated, KeyIn, ResourceId, TeamIn, TeamOut, TeamPatch
from broker.core.money import to_micros
from broker.services import teams
from broker.services.ledger import team_budget

router = APIRouter(
    prefix="/v1/teams",
    tags=["admin"],
    responses=error_responses(401, 403),
    route_class=SessionRoute,
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TeamOut,
    responses=error_responses(409, 413),
)
def create_team(body: TeamIn, session: SessionDep, now: NowDep, _: AdminDep) -> TeamOut:
    team = teams.create_team(
        session,
        body.name,
        to_micros(body.budget.limit),
        body.budget.period,
        body.budget.alert_at,
        now,
    )
    return team_out(team, team_budget(session, team, now))


@router.get("", response_model=list[TeamOut])
def list_teams(session: SessionDep, now: NowDep, _: AdminDep) -> list[TeamOut]:
    return [team_out(t, team_budget(session, t, now)) for t in teams.list_teams(session)]


@router.get("/{team_id}", response_model=TeamOut, responses=error_responses(404))
def get_team(team_id: ResourceId, session: SessionDep, now: NowDep, _: AdminDep) -> TeamOut:
    return team_out(*teams.budget_of(session, team_id, now))


@router.patch("/{team_id}", response_model=TeamOut, responses=error_responses(404, 413))
def patch_team(
    team_id: ResourceId, body: TeamPatch, session: SessionDep, now: NowDep, _: AdminDep
) -> TeamOut:
    budget = body.budget
    team = teams.update_budget(
        session,
        team_id,
        now,
        limit=to_micros(budget.limit) if budget.limit is not None else None,
        period=budget.period,
        alert_at=budget.alert_at,
    )
    return team_out(team, team_budget(session, team, now))


@router.post(
    "/{team_id}/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=KeyCreated,
    responses=error_responses(404, 413),
)
def create_key(
    team_id: ResourceId, body: KeyIn, session: SessionDep, now: NowDep, _: AdminDep
) -> KeyCreated:
    key, token = teams.create_key(session, team_id, body.name, now)
    return KeyCreated(id=key.id, name=key.name, token=token, prefix=key.prefix)


@router.delete(
    "/{team_id}/keys/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404),
)
def revoke_key(
    team_id: ResourceId, key_id: ResourceId, session: SessionDep, now: NowDep, _: AdminDep
) -> Response:
    teams.revoke_key(session, team_id, key_id, now)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
