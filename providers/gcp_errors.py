"""Map google-cloud-compute failures (HTTP errors and operation errors) onto domain errors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from providers.base import (
    CapacityError,
    InstanceNotFound,
    ProviderError,
    QuotaError,
    TransientError,
)

CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "resourceExhausted",
        "resourcePoolExhausted",
        "STOCKOUT",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "limitExceeded"})
TRANSIENT_CODES = frozenset(
    {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED", "backendError"}
)
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


def _classify(codes: Iterable[str], status: int, text: str) -> ProviderError:
    codes = set(codes)
    if codes & CAPACITY_CODES:
        return CapacityError(text)
    if codes & QUOTA_CODES:
        return QuotaError(text)
    if codes & TRANSIENT_CODES or status in _TRANSIENT_STATUS:
        return TransientError(text)
    if status == 404:
        return InstanceNotFound(text)
    return ProviderError(text)


def to_domain_error(exc: Exception, action: str) -> ProviderError:
    """The domain error for a failed Compute API call; ``action`` names it for the message."""
    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = [str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)]
        status = int(exc.code or 0) if isinstance(exc.code, int) else 0
        return _classify(reasons, status, f"GCE {action} failed: {exc.message}")
    if isinstance(exc, requests.RequestException | auth_exc.TransportError | TimeoutError):
        return TransientError(f"GCE {action} failed: {exc}")
    if isinstance(exc, gexc.GoogleAPIError):
        return ProviderError(f"GCE {action} failed: {exc}")
    raise TypeError(f"not a Compute API error: {exc!r}")


def operation_error(operation: Any, action: str) -> ProviderError | None:
    """The domain error of a finished zone operation, or None when it succeeded."""
    errors = list(operation.error.errors) if operation.error else []
    if not errors:
        return None
    codes = [e.code for e in errors]
    messages = "; ".join(f"{e.code}: {e.message}" for e in errors)
    # Classified by code only: the operation's HTTP status (503 for a stockout) says little.
    return _classify(codes, 0, f"GCE {action} failed: {messages}")
