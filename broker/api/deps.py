"""Request dependencies: the database session, the clock's now, and the calling principal."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any

from anyio import CapacityLimiter, to_thread
from anyio.lowlevel import RunVar
from fastapi import Depends, Header, HTTPException, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from sqlmodel import Session
from starlette._utils import is_async_callable

from broker import clock
from broker.db.engine import open_session
from broker.services.teams import Principal, authenticate, trusted_principal
from broker.settings import get_settings

# Threads that only close sessions. A request that still holds a connection (a read ends
# its route inside a transaction) must not wait for one of the routes' ``api_threads`` to give
# it back: with more such requests than the pool has connections, the routes in those
# threads would wait for a connection only a thread can free, until the pool's timeout.
CLOSE_THREADS = 2
_closers: RunVar[CapacityLimiter] = RunVar("session_closers")


def _closer_threads() -> CapacityLimiter:
    """This event loop's limiter for closing sessions."""
    try:
        return _closers.get()
    except LookupError:
        _closers.set(limiter := CapacityLimiter(CLOSE_THREADS))
        return limiter


async def get_session() -> AsyncIterator[Session]:
    """One session per request; services commit what they change.

    Async so that opening and closing it cost no thread hop: a session connects on first use
    (in the route's thread), and one whose work ended in a commit closes without I/O. A
    session still holding a transaction (a read, an error path) is closed in threads of its
    own (``CLOSE_THREADS``), never queued behind the routes it would give a connection to.
    """
    session = open_session()
    try:
        yield session
    finally:
        if session.in_transaction():
            await to_thread.run_sync(session.close, limiter=_closer_threads())
        else:
            session.close()


class SessionRoute(APIRoute):
    """A route whose sync endpoint ends its session's transaction in its own thread.

    FastAPI validates a sync endpoint's return value in another trip to the thread pool, then
    sends the response and runs background tasks (also in the pool) before the session
    closes. A read leaves its transaction, and so its connection, open across those waits:
    with more such requests than the pool holds, the endpoints running in the threads wait
    for a connection only a waiting request can give back, until the pool's timeout. Every
    router of the API uses this class (``tests/api/test_route_table.py`` checks it).
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not is_async_callable(endpoint):
            endpoint = _ending_transactions(endpoint)
        super().__init__(path, endpoint, **kwargs)


def _ending_transactions(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)  # FastAPI reads the signature through __wrapped__
    def run(*args: Any, **kwargs: Any) -> Any:
        ended = False
        try:
            result = endpoint(*args, **kwargs)
            ended = True
            return result
        finally:
            for value in kwargs.values():
                if isinstance(value, Session) and value.in_transaction():
                    end_transaction(value, keep=ended)

    return run


def end_transaction(session: Session, keep: bool) -> None:
    """Give back the connection of what a route read: commit a transaction that wrote
    nothing (with ``expire_on_commit=False`` what it loaded stays readable), roll back one
    that failed (``keep`` false) or left changes no service committed."""
    if keep and not (session.new or session.dirty or session.deleted):
        session.commit()
    else:
        session.rollback()


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
        principal = await run_in_threadpool(_authenticate, session, token, admin)
    if principal is None:
        raise _UNAUTHORIZED
    return principal


def _authenticate(session: Session, token: str, admin: str | None) -> Principal | None:
    """``authenticate``, its connection given back before the route waits for a thread."""
    try:
        return authenticate(session, token, admin)
    finally:
        session.rollback()


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
