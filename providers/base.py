"""The Provider protocol every cloud adapter implements, its value types and its errors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from broker.core.errors import BrokerError

Market = Literal["spot", "on_demand"]
InstanceStatus = Literal["pending", "running", "terminated", "preempted"]

TAG_JOB = "broker-job"
TAG_ATTEMPT = "broker-attempt"
TAG_TEAM = "broker-team"
TAG_NODE = "broker-node"  # a gang node's rank ("0".."N-1"); absent on a single instance
# Presence of this tag (label on GCP) is what makes an instance "managed by the broker".
MANAGED_TAG = TAG_JOB

REASON_SPOT_PREEMPTED = "spot_preempted"
REASON_USER_TERMINATED = "user_terminated"


class ProviderError(BrokerError):
    """A cloud call failed for a reason not covered by a more specific error."""

    code = "provider_error"


class CapacityError(ProviderError):
    """The zone has no capacity for this instance type and market right now."""

    code = "capacity"


class QuotaError(ProviderError):
    """The account's quota (instances, vCPUs, GPUs) does not allow this launch."""

    code = "quota"


class TransientError(ProviderError):
    """Throttling, a 5xx or a timeout: worth retrying with backoff."""

    code = "transient"


class InstanceNotFound(ProviderError):
    """The cloud knows nothing about this instance (never existed or long gone)."""

    code = "instance_not_found"


class ObjectNotFound(ProviderError):
    """The checkpoint store has no object under that key (or no such bucket)."""

    code = "object_not_found"


@dataclass(frozen=True)
class LaunchRequest:
    """One instance to launch; ``token`` (the attempt id) makes the launch idempotent.

    ``boot_script`` (``providers.boot``) is what the instance runs at boot: EC2 user data,
    GCE metadata ``startup-script``; empty launches a machine that runs nothing of ours.
    It carries the attempt's agent token, so it is never logged. ``placement_group``: the
    name of the placement a gang's instances share to sit close together (an EC2 cluster
    placement group, created on first use; GCE has no equivalent here and ignores it).
    """

    token: str
    provider: str
    region: str
    zone: str
    instance_type: str
    market: Market
    gpu: str
    gpu_count: int = 1
    tags: dict[str, str] = field(default_factory=dict)
    boot_script: str = field(default="", repr=False)
    placement_group: str | None = None

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("LaunchRequest.token must not be empty")
        if self.market not in ("spot", "on_demand"):
            raise ValueError(f"LaunchRequest.market must be spot or on_demand, not {self.market!r}")
        if self.gpu_count < 0:
            raise ValueError("LaunchRequest.gpu_count must be >= 0")


@dataclass(frozen=True)
class InstanceRef:
    """Enough to find an instance again: on GCP ``instance_id`` is the instance name."""

    provider: str
    region: str
    zone: str
    instance_id: str

    # Equal to any ref of the same instance, so a listed ``ManagedInstance`` matches it.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InstanceRef):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[str, str, str, str]:
        return (self.provider, self.region, self.zone, self.instance_id)


@dataclass(frozen=True)
class InstanceState:
    """What the cloud says about an instance right now. ``launched_at``, ``tags`` and
    ``market`` are what the describing call reports: a status-only describe of an up
    instance (EC2's DescribeInstanceStatus in ``describe_many``) leaves them empty."""

    status: InstanceStatus
    reason: str | None
    launched_at: datetime | None
    terminated_at: datetime | None = None
    tags: dict[str, str] = field(default_factory=dict)
    market: Market | None = None


@dataclass(frozen=True, eq=False)
class ManagedInstance(InstanceRef):
    """A ref as ``list_managed`` found it, with the state the same listing reported."""

    state: InstanceState = field(kw_only=True)


@runtime_checkable
class Provider(Protocol):
    """One cloud, seen by the broker: launch, describe, terminate, list what is ours."""

    name: str

    def launch(self, request: LaunchRequest) -> InstanceRef:
        """Start the instance (or return the one already started for ``request.token``)."""
        ...

    def describe(self, ref: InstanceRef) -> InstanceState:
        """The instance's current status; raises ``InstanceNotFound`` if it is unknown."""
        ...

    def terminate(self, ref: InstanceRef) -> None:
        """Terminate the instance; terminating a gone instance is not an error."""
        ...

    def describe_many(self, refs: Sequence[InstanceRef]) -> dict[InstanceRef, InstanceState | None]:
        """``describe`` for many instances in as few calls as the API allows; None for an
        instance the cloud knows nothing about (never an error for the whole batch)."""
        ...

    def regions(self) -> list[str]:
        """The regions this provider manages instances in (configuration, no cloud call)."""
        ...

    def list_managed(self, region: str) -> list[ManagedInstance]:
        """Every live or recently ended instance in ``region`` tagged as the broker's, with
        its state and tags, in one cloud call per page."""
        ...


_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")


def sanitize_label(value: str, *, key: bool = False) -> str:
    """A GCP label key or value: lowercase ``[a-z0-9_-]``, at most 63 characters.

    Keys must also start with a letter, so a prefix is added when they do not.
    """
    cleaned = _LABEL_BAD.sub("-", value.lower())[:63]
    if key and not cleaned[:1].isalpha():
        cleaned = ("k-" + cleaned)[:63]
    return cleaned
