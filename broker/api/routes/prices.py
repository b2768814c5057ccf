"""Team route: the current price of every offer the broker may launch, and where it came from."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from broker.api.deps import SessionDep, SessionRoute, TeamDep
from broker.api.errors import ValidationErrorBody, error_responses
from broker.api.present import price_out
from broker.api.schemas import PricePage
from broker.services.quoting import get_planning

router = APIRouter(
    prefix="/v1", tags=["prices"], responses=error_responses(401, 403), route_class=SessionRoute
)
Filter = Annotated[str | None, Query(min_length=1, max_length=60)]
BAD_FILTER = {
    422: {
        "model": ValidationErrorBody,
        "description": "A filter no offer matches, or a bad market (`detail` names the field "
        "and the values it may take)",
    }
}


@router.get("/prices", response_model=PricePage, responses=BAD_FILTER)
def list_prices(
    session: SessionDep,
    _team_id: TeamDep,
    gpu: Filter = None,
    provider: Filter = None,
    region: Filter = None,
    market: Annotated[Literal["spot", "on_demand"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> PricePage:
    """Current prices (one row per offer and market; bundled ones with ``observed_at`` null),
    cheapest first per GPU type and count."""
    rows = get_planning().prices(session, gpu=gpu, provider=provider, region=region, market=market)
    page = rows[offset : offset + limit]
    more = offset + limit < len(rows)
    return PricePage(
        items=[price_out(r) for r in page],
        total=len(rows),
        next_offset=offset + limit if more else None,
    )
