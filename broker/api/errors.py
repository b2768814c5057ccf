"""The one place where domain errors become HTTP responses (API.md's error bodies)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from broker.errors import (
    BrokerError,
    BudgetExceeded,
    Conflict,
    Infeasible,
    InvalidInput,
    NotFound,
)

STATUS_OF: dict[type[BrokerError], int] = {
    NotFound: 404,
    Conflict: 409,
    BudgetExceeded: 402,
    Infeasible: 422,
}


def _status(error: BrokerError) -> int:
    for kind in type(error).__mro__:
        if kind in STATUS_OF:
            return STATUS_OF[kind]
    return 400


async def _broker_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, BrokerError)
    if isinstance(error, InvalidInput):
        # Same shape as FastAPI's own validation errors, so clients parse one format.
        loc = [error.location, error.field] if error.field else [error.location]
        body = {"detail": [{"loc": loc, "msg": error.message, "type": "value_error"}]}
        return JSONResponse(status_code=422, content=body)
    return JSONResponse(
        status_code=_status(error),
        content={"detail": {"code": error.code, "message": error.message}},
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the domain-error mapping on ``app``."""
    app.add_exception_handler(BrokerError, _broker_error)
