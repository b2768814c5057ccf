"""Team route: what a job would cost, without launching anything."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from broker.api.deps import NowDep, SessionDep, SessionRoute, TeamDep
from broker.api.errors import INFEASIBLE_OR_INVALID, error_responses
from broker.api.present import plan_fields
from broker.api.schemas import PlanOut
from broker.services.admission import check_deadline
from broker.services.job_spec import JobSpec
from broker.services.quoting import quote_job

router = APIRouter(
    prefix="/v1", tags=["quotes"], responses=error_responses(401, 403), route_class=SessionRoute
)


class QuoteOut(BaseModel):
    plans: list[PlanOut]
    cheapest_on_demand: PlanOut | None


@router.post(
    "/quotes",
    response_model=QuoteOut,
    responses={**error_responses(413), **INFEASIBLE_OR_INVALID},
)
def post_quote(spec: JobSpec, session: SessionDep, now: NowDep, _team_id: TeamDep) -> QuoteOut:
    spec = spec.resolved(now)  # a relative deadline counts from the broker's clock, as at admission
    check_deadline(spec, now)
    plans = quote_job(spec, now, session)
    cheapest = plans.cheapest_on_demand
    return QuoteOut(
        plans=[PlanOut.model_validate(plan_fields(p)) for p in plans.plans],
        cheapest_on_demand=PlanOut.model_validate(plan_fields(cheapest)) if cheapest else None,
    )
