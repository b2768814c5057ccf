"""Operational routes."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from broker.api.deps import SessionDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz(session: SessionDep) -> dict[str, str]:
    session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    return {"status": "ok"}
