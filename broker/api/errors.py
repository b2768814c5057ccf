"""The one place where domain errors become HTTP responses (API.md's error bodies), and
where those responses are declared for the OpenAPI schema."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.core.errors import (
    BrokerError,
    BudgetExceeded,
    Conflict,
    Infeasible,
    InvalidInput,
    NotFound,
    Unauthorized,
)

STATUS_OF: dict[type[BrokerError], int] = {
    Unauthorized: 401,
    NotFound: 404,
    Conflict: 409,
    BudgetExceeded: 402,
    Infeasible: 422,
}


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """A domain error: ``{"detail": {"code": ..., "message": ...}}``."""

    detail: ErrorDetail


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    """FastAPI's validation error body: ``detail`` lists the fields at fault."""

    detail: list[FieldError]


_DESCRIPTIONS = {
    401: "Missing or invalid bearer token (`unauthorized`)",
    402: "The team's budget cannot cover the job (`budget_exceeded`)",
    403: "The route needs the other kind of principal (`forbidden`)",
    404: "No such resource, or not this team's (`not_found`)",
    409: "Conflict with the resource's state or an earlier request (`conflict`)",
    413: "Request body over the size limit (`too_large`)",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the domain error ``codes`` a route can return."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in codes}


INFEASIBLE_OR_INVALID: dict[int | str, dict[str, Any]] = {
    422: {
        "model": ValidationErrorBody | ErrorBody,
        "description": "A field is invalid (`detail` names it), or no plan is `infeasible`",
    }
}
"""For routes that plan a job: 422 is either a validation error or ``infeasible``."""


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


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as strings: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


async def _validation_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    # FastAPI's own body, except that a NaN or Infinity the client sent (Python's JSON
    # parser accepts them) is echoed back as a string instead of failing to encode (a 500).
    return JSONResponse(
        status_code=422, content={"detail": _finite(jsonable_encoder(error.errors()))}
    )


async def _http_error(request: Request, error: Exception) -> Any:
    assert isinstance(error, StarletteHTTPException)
    # FastAPI answers 400 when a JSON body cannot even be decoded (not UTF-8, nested too
    # deeply); it raises that from the decoding error. That is bad input like malformed
    # JSON, so it gets malformed JSON's 422 and body.
    if error.status_code == 400 and error.__cause__ is not None:
        msg = "request body could not be decoded (not UTF-8 JSON, or nested too deeply)"
        body = {"detail": [{"loc": ["body"], "msg": msg, "type": "json_invalid"}]}
        return JSONResponse(status_code=422, content=body)
    return await http_exception_handler(request, error)


def install_error_handlers(app: FastAPI) -> None:
    """Register the domain-error mapping on ``app``."""
    app.add_exception_handler(BrokerError, _broker_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
