"""Request dependencies: the database session, the clock's now, and the calling principal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Header, HTTPException, status
from fastapi.concurrency import run_in_threadpool
from sqlmodel import Session

from broker import clock
from broker.db.engine import open_session
from broker.services.teams import Principal, authenticate, trusted_principal
from broker.settings import get_settings


async def get_session() -> AsyncIterator[Session]:
    """One session per request; services commit what they change.

    Async so that opening and closing it cost no thread hop: a session connects on first use
    (in the route's thread), and one whose work ended in a commit closes without I/O; only a
    session still holding a transaction (an error path) is closed in the thread pool.
    """
    session = open_session()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def get_now() -> datetime:
    """The broker's clock, read once per request (no I/O: it runs on the event loop)."""
    return clock.now()


SessionDep = Annotated[Session, Depends(get_session)]
NowDep = Annotated[datetime, Depends(get_now)]

_UNAUTHORIZED = HTTPException(
    status_code=status.HTTP_401_UNAUTHORIZED,
    detail={"code": "unauthorized", "message": "missing or invalid bearer token"},
    headers={"WWW-Authenticate": "Bearer"},
)


async def get_principal(
    session: SessionDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    """The admin or team behind ``Authorization: Bearer <token>``; 401 otherwise.

    A team key this process checked in the last ``key_check_seconds`` is trusted without a
    query (and without a thread hop); any other token is checked in the database.
    """
    if not authorization:
        raise _UNAUTHORIZED
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _UNAUTHORIZED
    settings = get_settings()
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    principal = trusted_principal(token, admin, settings.key_check_seconds)
    if principal is None:
        principal = await run_in_threadpool(authenticate, session, token, admin)
    if principal is None:
        raise _UNAUTHORIZED
    return principal


async def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """Admin routes: the admin token only (403 for a team key)."""
    if not principal.is_admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail={"code": "forbidden", "message": "this route needs the admin token"},
        )
    return principal


async def require_team(principal: Annotated[Principal, Depends(get_principal)]) -> str:
    """Team routes: a team key; returns the team id (403 for the admin token)."""
    if principal.team_id is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail={"code": "forbidden", "message": "this route needs a team key"},
        )
    return principal.team_id


AdminDep = Annotated[Principal, Depends(require_admin)]
TeamDep = Annotated[str, Depends(require_team)]
