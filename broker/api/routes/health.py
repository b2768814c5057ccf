"""Operational routes."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from broker.api.deps import NowDep, SessionDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz(session: SessionDep, now: NowDep) -> dict[str, str]:
    """The database answers; ``time`` is the broker's clock (scaled in demos)."""
    session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    return {"status": "ok", "time": now.isoformat()}
