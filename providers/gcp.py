"""Google Compute Engine behind the Provider protocol, through google-cloud-compute (REST).

Instances are named from the attempt id and inserted with a ``requestId`` derived from
it, so a repeated launch returns the same instance. A preemption is recognized from the
zone's ``compute.instances.preempted`` operation for the instance.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from broker import clock
from broker.settings import Settings
from providers.base import (
    MANAGED_TAG,
    REASON_SPOT_PREEMPTED,
    REASON_USER_TERMINATED,
    TAG_ATTEMPT,
    InstanceNotFound,
    InstanceRef,
    InstanceState,
    LaunchRequest,
    ManagedInstance,
    ProviderError,
    TransientError,
    sanitize_label,
)
from providers.gcp_errors import operation_error, to_domain_error
from providers.gcp_instance import architecture, instance_resource
from providers.retry import RetryPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")

API_BASE = "https://www.googleapis.com/compute/v1"
IMAGE_PROJECT = "deeplearning-platform-release"
IMAGE_FAMILIES = {"x86_64": "common-cu124-debian-11-py310"}
PREEMPTED_OPERATION = "compute.instances.preempted"
_NAMESPACE = uuid.UUID("6f1c2d4e-9a51-4c43-8d0e-5b3c1e7a2f90")
_ENDED = {"STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"}
# Instance names per aggregatedList call in ``describe_many`` (a ``name eq`` alternation):
# names are at most 56 characters, so the filter stays about 3 KB in the request's URL.
NAMES_PER_CALL = 50
# The partial response ``_aggregated`` asks for: what ``listed_state``, ``_with_history`` and
# the callers read of an instance (the zone comes from the scope key ``zones/<zone>``), and
# the page token the pager follows. The client parses only these, not the whole resource.
AGGREGATED_FIELDS = (
    "nextPageToken,items/*/instances(name,status,labels,creationTimestamp,"
    "lastStopTimestamp,scheduling/provisioningModel)"
)
# ``describe_many``'s first pass: an up instance needs only its status (like EC2's
# DescribeInstanceStatus); parsing each instance's labels was most of the describe's CPU.
STATUS_FIELDS = "nextPageToken,items/*/instances(name,status)"
_STARTING = {"PROVISIONING", "STAGING"}


def instance_name(token: str) -> str:
    """A valid, deterministic GCE instance name for an attempt id."""
    slug = re.sub(r"[^a-z0-9-]+", "-", token.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha256(token.encode()).hexdigest()[:8]
    return f"broker-{slug}-{digest}" if slug else f"broker-{digest}"


def request_id(token: str, action: str = "insert") -> str:
    """The GCE ``requestId`` (a UUID) for one action on one attempt."""
    return str(uuid.uuid5(_NAMESPACE, f"{action}:{token}"))


def is_local_endpoint(endpoint_url: str | None) -> bool:
    """Whether the endpoint is a plain-http fake (anonymous credentials), not Google's API."""
    return bool(endpoint_url and endpoint_url.startswith("http://"))


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _up_status(status: str) -> Literal["pending", "running"]:
    """The broker's status of an instance that has not ended, from its GCE status."""
    return "pending" if status in _STARTING else "running"


def listed_state(instance: Any) -> InstanceState:
    """The state an instance resource shows by itself; an ended one is ``terminated``."""
    labels = dict(instance.labels)
    market: Literal["spot", "on_demand"] = (
        "spot" if instance.scheduling.provisioning_model == "SPOT" else "on_demand"
    )
    launched_at = _time(instance.creation_timestamp) or clock.now()
    if instance.status not in _ENDED:
        return InstanceState(_up_status(instance.status), None, launched_at, None, labels, market)
    ended_at = _time(instance.last_stop_timestamp or None)
    return InstanceState(
        "terminated", instance.status.lower(), launched_at, ended_at, labels, market
    )


class GcpProvider:
    """Compute Engine instances for the broker in one project, retried on transient errors.

    Instances boot a Deep Learning VM image (the family for their architecture), install the
    NVIDIA driver at boot, run the request's boot script as ``startup-script`` and, when
    ``service_account`` is given, run as that account with read-write Cloud Storage.
    """

    name = "gcp"

    def __init__(
        self,
        *,
        project: str,
        zones: Sequence[str] = (),
        endpoint_url: str | None = None,
        credentials: Credentials | None = None,
        termination_action: Literal["DELETE", "STOP"] = "DELETE",
        image_project: str = IMAGE_PROJECT,
        image_families: Mapping[str, str] = IMAGE_FAMILIES,
        service_account: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        operation_timeout: float = 300.0,
        describe_batch: int = NAMES_PER_CALL,
    ) -> None:
        self.project = project
        self.zones = list(zones)
        self.termination_action = termination_action
        self.image_project = image_project
        self.image_families = dict(image_families)
        self.service_account = service_account
        self.describe_batch = describe_batch
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._operation_timeout = operation_timeout
        options = ClientOptions(api_endpoint=endpoint_url) if endpoint_url else None
        kwargs: dict[str, Any] = {"credentials": credentials, "client_options": options}
        self._instances = compute_v1.InstancesClient(transport="rest", **kwargs)
        self._operations = compute_v1.ZoneOperationsClient(transport="rest", **kwargs)
        self._zones_client = compute_v1.ZonesClient(transport="rest", **kwargs)
        self._images = compute_v1.ImagesClient(transport="rest", **kwargs)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> GcpProvider:
        """Build from ``BROKER_GCP_*``; a plain-http endpoint gets anonymous credentials."""
        endpoint = settings.gcp_endpoint_url
        options: dict[str, Any] = {
            "project": settings.gcp_project,
            "zones": settings.gcp_zones,
            "endpoint_url": endpoint,
            "credentials": AnonymousCredentials() if is_local_endpoint(endpoint) else None,
            "image_project": settings.gcp_image_project,
            "image_families": settings.gcp_image_families,
            "service_account": settings.gcp_service_account,
        }
        options.update(overrides)
        return cls(**options)

    def launch(self, request: LaunchRequest) -> InstanceRef:
        """Insert the instance with a requestId from the attempt id; wait for the operation."""
        name = instance_name(request.token)
        labels = {TAG_ATTEMPT: request.token, **request.tags}
        resource = instance_resource(
            name=name,
            request=request,
            labels={sanitize_label(k, key=True): sanitize_label(str(v)) for k, v in labels.items()},
            termination_action=self.termination_action,
            image=self.image(architecture(request.instance_type)),
            service_account=self.service_account,
        )
        insert = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=request.zone,
            instance_resource=resource,
            request_id=request_id(request.token),
        )
        try:
            operation = self._call(
                "instances.insert",
                lambda: self._instances.insert_unary(
                    request=insert, retry=None, timeout=self._timeout
                ),
            )
        except gexc.Conflict:
            # Created by an earlier try under another requestId: same name, same instance.
            logger.info("GCE instance already exists", extra={"attempt_id": request.token})
        else:
            self._wait(request.zone, operation, "instances.insert")
        logger.info("launched GCE instance", extra={"attempt_id": request.token, "instance": name})
        return InstanceRef("gcp", request.region, request.zone, name)

    def describe(self, ref: InstanceRef) -> InstanceState:
        """Status from instances.get; a preemption operation makes it ``preempted``."""
        try:
            instance = self._call(
                "instances.get",
                lambda: self._instances.get(
                    project=self.project,
                    zone=ref.zone,
                    instance=ref.instance_id,
                    retry=None,
                    timeout=self._timeout,
                ),
            )
        except InstanceNotFound:
            return self._describe_gone(ref)
        return self._with_history(ref, instance)

    def terminate(self, ref: InstanceRef) -> None:
        """Delete the instance; one that is already gone counts as terminated."""
        delete = compute_v1.DeleteInstanceRequest(
            project=self.project,
            zone=ref.zone,
            instance=ref.instance_id,
            request_id=request_id(ref.instance_id, "delete"),
        )
        try:
            self._call(
                "instances.delete",
                lambda: self._instances.delete_unary(
                    request=delete, retry=None, timeout=self._timeout
                ),
            )
        except InstanceNotFound:
            logger.info("GCE instance already gone", extra={"instance": ref.instance_id})

    def describe_many(self, refs: Sequence[InstanceRef]) -> dict[InstanceRef, InstanceState | None]:
        """aggregatedList filtered by ``describe_batch`` names a call, asking only each
        instance's status (an up instance needs no more: its state has no launch time, labels
        or market), then again with ``AGGREGATED_FIELDS`` for the ended ones (their zone's
        operations tell a preemption apart); an instance not found is looked up in its
        zone's operations (deleted or preempted), None if unknown."""
        found: dict[InstanceRef, InstanceState | None] = {}
        wanted = {(ref.zone, ref.instance_id): ref for ref in refs}
        ended: list[str] = []
        for zone, instance in self._named(sorted({ref.instance_id for ref in refs}), STATUS_FIELDS):
            ref = wanted.get((zone, instance.name))
            if ref is None:
                continue
            if instance.status in _ENDED:
                ended.append(ref.instance_id)
            else:
                found[ref] = InstanceState(_up_status(instance.status), None, None)
        for zone, instance in self._named(ended, AGGREGATED_FIELDS):
            ref = wanted.get((zone, instance.name))
            if ref is not None:
                found[ref] = self._with_history(ref, instance)
        for ref in refs:
            if ref not in found:
                try:
                    found[ref] = self._describe_gone(ref)
                except InstanceNotFound:
                    found[ref] = None
        return found

    def regions(self) -> list[str]:
        """The regions of ``BROKER_GCP_ZONES``."""
        return sorted({zone.rsplit("-", 1)[0] for zone in self.zones})

    def list_managed(self, region: str) -> list[ManagedInstance]:
        """Every instance of the region's zones that carries the broker's label, with its
        state (an ended one as ``terminated``: ``describe`` tells a preemption apart), from
        one aggregatedList a page."""
        listed = []
        for zone, instance in self._aggregated(f"labels.{MANAGED_TAG}:*"):
            if zone != region and not zone.startswith(region + "-"):
                continue
            listed.append(
                ManagedInstance(
                    "gcp",
                    zone.rsplit("-", 1)[0],
                    zone,
                    instance.name,
                    state=listed_state(instance),
                )
            )
        return listed

    def _named(self, names: Sequence[str], fields: str) -> list[tuple[str, Any]]:
        """``_aggregated`` for the instances called ``names``, ``describe_batch`` a call."""
        return [
            listed
            for start in range(0, len(names), self.describe_batch)
            for listed in self._aggregated(
                f'name eq "{"|".join(names[start : start + self.describe_batch])}"', fields
            )
        ]

    def _aggregated(
        self, expression: str, fields: str = AGGREGATED_FIELDS
    ) -> list[tuple[str, Any]]:
        """(zone, instance) for every instance of the project that passes ``expression``,
        each with only the ``fields`` asked for (by default what ``listed_state`` reads).

        The selection goes as the ``X-Goog-FieldMask`` header, the header form of Google's
        ``fields`` system parameter (cloud.google.com/apis/docs/system-parameters; syntax in
        cloud.google.com/compute/docs/api/how-tos/performance, "Partial response"). The REST
        transport sends call ``metadata`` as HTTP headers, on every page, while its query
        string holds only the request message's fields, so ``fields=`` cannot be passed.
        """
        listing = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=expression)
        mask = (("x-goog-fieldmask", fields),)

        def fetch() -> list[tuple[str, Any]]:
            pager = self._instances.aggregated_list(
                request=listing, retry=None, timeout=self._timeout, metadata=mask
            )
            return [
                (key.rsplit("/", 1)[-1], instance)
                for key, scoped in pager
                for instance in scoped.instances
            ]

        return self._call("instances.aggregatedList", fetch)

    def _with_history(self, ref: InstanceRef, instance: Any) -> InstanceState:
        """An instance resource's state; for an ended one, its zone's operations say whether
        it was preempted."""
        listed = listed_state(instance)
        if instance.status not in _ENDED:
            return listed
        preempted = [op for op in self._history(ref) if op.operation_type == PREEMPTED_OPERATION]
        if not preempted:
            return listed
        ended_at = listed.terminated_at or _time(preempted[-1].insert_time)
        return InstanceState(
            "preempted",
            REASON_SPOT_PREEMPTED,
            listed.launched_at,
            ended_at,
            listed.tags,
            listed.market,
        )

    def image(self, arch: str) -> str:
        """The boot image for machines of ``arch``: the newest of its image family."""
        family = self.image_families.get(arch)
        if family is None:
            example = json.dumps({arch: f"<an image family of {self.image_project}>"})
            raise ProviderError(
                f"no GCP image family for {arch} machines: "
                f"set BROKER_GCP_IMAGE_FAMILIES='{example}'"
            )
        return f"projects/{self.image_project}/global/images/family/{family}"

    # -- account checks (``broker doctor``) ----------------------------------------------

    def zone_names(self) -> list[str]:
        """The zones the project sees (zones.list): proves the endpoint and credentials."""

        def fetch() -> list[str]:
            pager = self._zones_client.list(project=self.project, retry=None, timeout=self._timeout)
            return [zone.name for zone in pager]

        return self._call("zones.list", fetch)

    def image_from_family(self, arch: str) -> str:
        """The name of the image ``image(arch)`` boots today (images.getFromFamily)."""
        family = self.image(arch).rsplit("/", 1)[-1]
        found = self._call(
            "images.getFromFamily",
            lambda: self._images.get_from_family(
                project=self.image_project, family=family, retry=None, timeout=self._timeout
            ),
        )
        return str(found.name)

    def _describe_gone(self, ref: InstanceRef) -> InstanceState:
        history = self._history(ref)
        if not history:
            raise InstanceNotFound(f"GCE instance {ref.instance_id} not found in {ref.zone}")
        inserted = next((op for op in history if op.operation_type == "insert"), None)
        launched_at = _time(inserted.insert_time if inserted else None) or clock.now()
        last = history[-1]
        ended_at = _time(last.end_time or last.insert_time)
        if any(op.operation_type == PREEMPTED_OPERATION for op in history):
            return InstanceState("preempted", REASON_SPOT_PREEMPTED, launched_at, ended_at)
        return InstanceState("terminated", REASON_USER_TERMINATED, launched_at, ended_at)

    def _history(self, ref: InstanceRef) -> list[Any]:
        """The zone operations that targeted this instance, oldest first."""
        link = f"{API_BASE}/projects/{self.project}/zones/{ref.zone}/instances/{ref.instance_id}"
        listing = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=ref.zone, filter=f'targetLink = "{link}"'
        )

        def fetch() -> list[Any]:
            pager = self._operations.list(request=listing, retry=None, timeout=self._timeout)
            return [op for op in pager if op.target_link.endswith(f"/instances/{ref.instance_id}")]

        return sorted(self._call("zoneOperations.list", fetch), key=lambda op: op.insert_time)

    def _wait(self, zone: str, operation: Any, action: str) -> Any:
        def poll(name: str) -> Any:
            return self._call(
                "zoneOperations.wait",
                lambda: self._operations.wait(
                    project=self.project,
                    zone=zone,
                    operation=name,
                    retry=None,
                    timeout=self._timeout,
                ),
            )

        deadline = time.monotonic() + self._operation_timeout
        while operation.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise TransientError(f"GCE {action}: operation {operation.name} still running")
            operation = poll(operation.name)
        error = operation_error(operation, action)
        if error is not None:
            raise error
        return operation

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        def mapped() -> T:
            try:
                return fn()
            except gexc.Conflict:
                raise
            except Exception as exc:
                try:
                    domain = to_domain_error(exc, action)
                except TypeError:
                    raise exc from None
                raise domain from exc

        return self._retry.call(mapped)
