"""Map boto3/botocore failures onto the domain errors of ``providers.base``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from providers.base import (
    CapacityError,
    InstanceNotFound,
    ObjectNotFound,
    ProviderError,
    QuotaError,
    TransientError,
)
from providers.retry import RetryPolicy

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientCapacityOnHost",
        "SpotMaxPriceTooLow",
        "Unsupported",  # instance type not offered in the requested zone
    }
)
QUOTA_CODES = frozenset(
    {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"}
)
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "EC2ThrottledException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound"})
MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404"})


def error_code(exc: ClientError) -> str:
    """The AWS error code of a ``ClientError`` (e.g. ``InsufficientInstanceCapacity``)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def to_domain_error(exc: Exception, action: str) -> ProviderError:
    """The domain error for a failed boto3 call; ``action`` names the call for the message."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"AWS {action} failed: {code}: {message}"
        if code in CAPACITY_CODES:
            return CapacityError(text)
        if code in QUOTA_CODES:
            return QuotaError(text)
        if code in NOT_FOUND_CODES:
            return InstanceNotFound(text)
        if code in MISSING_OBJECT_CODES:
            return ObjectNotFound(text)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientError(text)
        return ProviderError(text)
    if isinstance(exc, ConnectionError | HTTPClientError):
        return TransientError(f"AWS {action} failed: {exc}")
    if isinstance(exc, BotoCoreError):
        return ProviderError(f"AWS {action} failed: {exc}")
    raise TypeError(f"not a boto3 error: {exc!r}")


T = TypeVar("T")


def call_aws(retry: RetryPolicy, action: str, fn: Callable[[], T]) -> T:
    """Run one boto3 call under ``retry``, its botocore errors mapped to domain errors."""

    def mapped() -> T:
        try:
            return fn()
        except (ClientError, BotoCoreError) as exc:
            raise to_domain_error(exc, action) from exc

    return retry.call(mapped)
