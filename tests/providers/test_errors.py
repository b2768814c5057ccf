"""Error mapping of both adapters, and the names they derive from attempt ids."""

from __future__ import annotations

import re

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from hypothesis import given
from hypothesis import strategies as st

from providers import aws_errors, gcp_errors
from providers.aws import client_token
from providers.base import (
    CapacityError,
    InstanceNotFound,
    ProviderError,
    QuotaError,
    TransientError,
    sanitize_label,
)
from providers.gcp import instance_name, request_id


def _client_error(code: str, status: int = 400) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "RunInstances")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("InsufficientInstanceCapacity", 500, CapacityError),
        ("SpotMaxPriceTooLow", 400, CapacityError),
        ("Unsupported", 400, CapacityError),
        ("VcpuLimitExceeded", 400, QuotaError),
        ("MaxSpotInstanceCountExceeded", 400, QuotaError),
        ("RequestLimitExceeded", 503, TransientError),
        ("SomethingNew", 502, TransientError),
        ("InvalidInstanceID.NotFound", 400, InstanceNotFound),
        ("InvalidParameterValue", 400, ProviderError),
    ],
)
def test_aws_errors_map_to_domain_errors(code: str, status: int, expected: type) -> None:
    error = aws_errors.to_domain_error(_client_error(code, status), "RunInstances")
    assert type(error) is expected
    assert code in error.message


def test_aws_connection_failures_are_transient() -> None:
    exc = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert isinstance(aws_errors.to_domain_error(exc, "DescribeInstances"), TransientError)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (gexc.TooManyRequests("slow", errors=[{"reason": "rateLimitExceeded"}]), TransientError),
        (gexc.Forbidden("rate", errors=[{"reason": "rateLimitExceeded"}]), TransientError),
        (gexc.Forbidden("quota", errors=[{"reason": "quotaExceeded"}]), QuotaError),
        (gexc.ServiceUnavailable("down"), TransientError),
        (gexc.NotFound("gone"), InstanceNotFound),
        (gexc.BadRequest("bad", errors=[{"reason": "invalid"}]), ProviderError),
    ],
)
def test_gce_http_errors_map_to_domain_errors(exc: Exception, expected: type) -> None:
    assert type(gcp_errors.to_domain_error(exc, "instances.insert")) is expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", CapacityError),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", CapacityError),
        ("QUOTA_EXCEEDED", QuotaError),
        ("RESOURCE_NOT_FOUND", ProviderError),
    ],
)
def test_gce_operation_errors_map_to_domain_errors(code: str, expected: type) -> None:
    operation = compute_v1.Operation(
        error=compute_v1.Error(errors=[compute_v1.Errors(code=code, message="m")])
    )
    assert type(gcp_errors.operation_error(operation, "instances.insert")) is expected


def test_a_successful_operation_has_no_error() -> None:
    assert gcp_errors.operation_error(compute_v1.Operation(), "instances.insert") is None


_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@given(st.text(min_size=1, max_size=200))
def test_derived_names_are_valid_and_deterministic(token: str) -> None:
    name = instance_name(token)
    assert _GCE_NAME.match(name)
    assert name == instance_name(token)
    assert request_id(token) == request_id(token) != request_id(token, "delete")
    assert 0 < len(client_token(token)) <= 64


@given(st.text(max_size=100))
def test_sanitized_labels_are_valid_gce_labels(value: str) -> None:
    assert re.fullmatch(r"[a-z0-9_-]{0,63}", sanitize_label(value))
    key = sanitize_label(value or "x", key=True)
    assert re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key)
