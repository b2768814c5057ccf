"""The GCE fake's state: instances and zone operations, as the Compute v1 API shows them.

With ``LocalInstances``, an inserted instance runs its ``startup-script`` metadata item as a
local process, which a delete or a spot preemption (30 s after its notice) kills.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from providers.local.gce_catalog import ACCELERATOR_TYPES, MACHINE_TYPES, gpu_of
from providers.local.instances import NOTICE_SECONDS, LocalInstances
from providers.local.market import MarketReplay

logger = logging.getLogger(__name__)

BASE = "https://www.googleapis.com/compute/v1"
Resource = dict[str, Any]
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_TERM = re.compile(r'([\w.\-]+)\s*(!=|=|:|eq|ne)\s*("[^"]*"|[^\s()]+)')


class ApiError(Exception):
    """An error the fake answers in Google's JSON error format."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def matches_filter(resource: Resource, expression: str | None) -> bool:
    """Whether a resource passes a Compute list filter (terms joined by AND).

    Supported: ``field = value``, ``field != value``, ``field:*`` (has), ``field:value``
    and ``field eq regex``; ``labels.KEY`` reaches into labels.
    """
    for field, op, raw in _TERM.findall(expression or ""):
        value: Any = resource
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        wanted = raw[1:-1] if raw.startswith('"') else raw
        text = None if value is None else str(value)
        if op == ":" and wanted == "*":
            ok = value is not None
        elif op in ("=", ":"):
            ok = text == wanted
        elif op == "!=":
            ok = text != wanted
        else:
            ok = text is not None and re.fullmatch(wanted, text) is not None
            ok = ok if op == "eq" else not ok
        if not ok:
            return False
    return True


class ComputeState:
    """Instances and operations per (project, zone); safe to use from several threads."""

    def __init__(
        self,
        zones: Iterable[str],
        *,
        now: Callable[[], datetime],
        market: MarketReplay | None = None,
        instances: LocalInstances | None = None,
        notice_seconds: float = NOTICE_SECONDS["gcp"],
    ) -> None:
        self.zones = list(zones)
        self.market = market
        self.instances = instances
        self.notice_seconds = notice_seconds
        self._noticed: dict[tuple[str, str, str], datetime] = {}
        self._now = now
        self._instances: dict[tuple[str, str, str], Resource] = {}
        self._operations: dict[tuple[str, str, str], Resource] = {}
        self._requests: dict[str, Resource] = {}
        self._ids = itertools.count(4_000_000_000_000)
        self._lock = threading.RLock()

    def stamp(self) -> str:
        """Now, as the API writes timestamps."""
        return self._now().isoformat(timespec="milliseconds")

    def check_zone(self, zone: str) -> None:
        """Raise 404 for a zone the fake does not serve."""
        if zone not in self.zones:
            raise ApiError(404, "notFound", f"The resource 'zones/{zone}' was not found")

    def insert(self, project: str, zone: str, body: Resource, request_id: str | None) -> Resource:
        """Create an instance (or return the operation of the same ``requestId``)."""
        self.check_zone(zone)
        booted: Resource | None = None
        with self._lock:
            if request_id and request_id in self._requests:
                return self._requests[request_id]
            name = str(body.get("name", ""))
            machine_type = str(body.get("machineType", "")).rsplit("/", 1)[-1]
            accelerators = body.get("guestAccelerators") or []
            accelerator = (
                accelerators[0].get("acceleratorType", "").rsplit("/", 1)[-1]
                if accelerators
                else None
            )
            self._validate(project, zone, name, machine_type, accelerator, body)
            zone_link = f"{BASE}/projects/{project}/zones/{zone}"
            link = f"{zone_link}/instances/{name}"
            scheduling = body.get("scheduling") or {}
            gpu = gpu_of(machine_type, accelerator)
            if (
                scheduling.get("provisioningModel") == "SPOT"
                and self.market is not None
                and not self.market.is_available("gcp", zone, gpu)
            ):
                error = {
                    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                    "message": f"The zone 'projects/{project}/zones/{zone}' does not have "
                    "enough resources available to fulfill the request. Try a different "
                    "zone, or try again later.",
                }
                op = self._operation(project, zone, "insert", link, error=error)
            else:
                instance = {
                    **body,
                    "kind": "compute#instance",
                    "id": str(next(self._ids)),
                    "name": name,
                    "zone": zone_link,
                    "machineType": f"{zone_link}/machineTypes/{machine_type}",
                    "status": "RUNNING",
                    "creationTimestamp": self.stamp(),
                    "lastStartTimestamp": self.stamp(),
                    "selfLink": link,
                    "labels": dict(body.get("labels") or {}),
                }
                self._instances[(project, zone, name)] = instance
                booted = instance
                op = self._operation(project, zone, "insert", link, target_id=instance["id"])
            if request_id:
                self._requests[request_id] = op
        if booted is not None:
            self._boot(booted)
        return op

    def _boot(self, instance: Resource) -> None:
        """Run the instance's ``startup-script`` as a local process, if there is one."""
        if self.instances is None:
            return
        items = (instance.get("metadata") or {}).get("items") or []
        script = next((i.get("value") for i in items if i.get("key") == "startup-script"), None)
        if not script:
            logger.info(
                "instance without a startup-script: nothing runs",
                extra={"instance_id": instance["name"]},
            )
            return
        gpu, count = _gpus(instance)
        try:
            self.instances.start(
                instance["name"], "gcp", str(script), gpu, count, dict(instance["labels"])
            )
        except Exception:  # the instance stands, as a machine that failed to boot would
            logger.exception(
                "local instance did not start", extra={"instance_id": instance["name"]}
            )

    def _validate(
        self,
        project: str,
        zone: str,
        name: str,
        machine_type: str,
        accelerator: str | None,
        body: Resource,
    ) -> None:
        if not _NAME.match(name):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        if (project, zone, name) in self._instances:
            raise ApiError(
                409,
                "alreadyExists",
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
            )
        if machine_type not in MACHINE_TYPES:
            raise ApiError(
                400,
                "invalid",
                f"Invalid value for field 'resource.machineType': '{machine_type}'. "
                "Machine type does not exist.",
            )
        if accelerator is not None:
            if accelerator not in ACCELERATOR_TYPES:
                raise ApiError(404, "notFound", f"Accelerator type '{accelerator}' was not found")
            if (body.get("scheduling") or {}).get("onHostMaintenance") != "TERMINATE":
                raise ApiError(
                    400,
                    "invalid",
                    "Instances with guest accelerators do not support live migration.",
                )

    def _operation(
        self,
        project: str,
        zone: str,
        kind: str,
        target: str,
        *,
        target_id: str = "",
        error: Resource | None = None,
        user: str = "broker@local",
    ) -> Resource:
        name = f"operation-{int(self._now().timestamp() * 1000)}-{uuid.uuid4().hex[:12]}"
        op: Resource = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "zone": f"{BASE}/projects/{project}/zones/{zone}",
            "operationType": kind,
            "targetLink": target,
            "status": "DONE",
            "user": user,
            "progress": 100,
            "insertTime": self.stamp(),
            "startTime": self.stamp(),
            "endTime": self.stamp(),
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}/operations/{name}",
        }
        if target_id:
            op["targetId"] = target_id
        if error is not None:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = 503
            op["httpErrorMessage"] = "SERVICE UNAVAILABLE"
        self._operations[(project, zone, name)] = op
        return op

    def get(self, project: str, zone: str, name: str) -> Resource:
        """One instance, or 404."""
        self.check_zone(zone)
        with self._lock:
            instance = self._instances.get((project, zone, name))
            if instance is None:
                raise ApiError(
                    404,
                    "notFound",
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                    "was not found",
                )
            return dict(instance)

    def delete(self, project: str, zone: str, name: str, request_id: str | None) -> Resource:
        """Delete an instance (or return the operation of the same ``requestId``)."""
        with self._lock:
            if request_id and request_id in self._requests:
                return self._requests[request_id]
            instance = self.get(project, zone, name)
            del self._instances[(project, zone, name)]
            op = self._operation(
                project, zone, "delete", instance["selfLink"], target_id=instance["id"]
            )
            if request_id:
                self._requests[request_id] = op
        if self.instances is not None:
            self.instances.kill(name)
        return op

    def list(self, project: str, zone: str, expression: str | None = None) -> list[Resource]:
        """Instances of one zone that pass the filter."""
        self.check_zone(zone)
        with self._lock:
            return [
                dict(r)
                for (p, z, _), r in sorted(self._instances.items())
                if p == project and z == zone and matches_filter(r, expression)
            ]

    def operation(self, project: str, zone: str, name: str) -> Resource:
        """One zone operation, or 404."""
        with self._lock:
            op = self._operations.get((project, zone, name))
        if op is None:
            raise ApiError(404, "notFound", f"The resource 'operations/{name}' was not found")
        return op

    def operations(self, project: str, zone: str, expression: str | None = None) -> list[Resource]:
        """Operations of one zone that pass the filter, oldest first."""
        self.check_zone(zone)
        with self._lock:
            return [
                op
                for (p, z, _), op in self._operations.items()
                if p == project and z == zone and matches_filter(op, expression)
            ]

    def preempt(self, market: MarketReplay) -> int:
        """Take back running SPOT instances in zones the market marks unavailable: a notice
        first (the metadata's ``preempted`` turns TRUE), the preemption ``notice_seconds``
        of market time later."""
        now = market.now()
        reclaimed: list[str] = []
        with self._lock:
            for key, instance in list(self._instances.items()):
                project, zone, name = key
                scheduling = instance.get("scheduling") or {}
                if scheduling.get("provisioningModel") != "SPOT" or instance["status"] != "RUNNING":
                    continue
                noticed = self._noticed.get(key)
                if noticed is None:
                    if market.is_available("gcp", zone, _gpus(instance)[0]):
                        continue
                    noticed = self._noticed[key] = now
                    if self.instances is not None:
                        reclaim = now + timedelta(seconds=self.notice_seconds)
                        self.instances.notice(name, "gcp", reclaim)
                if (now - noticed).total_seconds() < self.notice_seconds:
                    continue
                self._operation(
                    project,
                    zone,
                    "compute.instances.preempted",
                    instance["selfLink"],
                    target_id=instance["id"],
                    user="system",
                )
                if scheduling.get("instanceTerminationAction") == "DELETE":
                    del self._instances[key]
                else:
                    instance["status"] = "TERMINATED"
                    instance["lastStopTimestamp"] = self.stamp()
                reclaimed.append(name)
            running = {k for k, r in self._instances.items() if r["status"] == "RUNNING"}
            for gone in set(self._noticed) - running:
                del self._noticed[gone]
        if reclaimed and self.instances is not None:
            self.instances.kill_many(reclaimed)
        return len(reclaimed)


def _gpus(instance: Resource) -> tuple[str, int]:
    """The GPU an instance resource runs on and how many (1 when it names none)."""
    accelerators = instance.get("guestAccelerators") or [{}]
    accelerator = str(accelerators[0].get("acceleratorType", "")).rsplit("/", 1)[-1]
    machine_type = str(instance.get("machineType", "")).rsplit("/", 1)[-1]
    count = int(accelerators[0].get("acceleratorCount") or 0)
    count = count or MACHINE_TYPES.get(machine_type, (0, 0, "", 0))[3]
    return gpu_of(machine_type, accelerator or None), max(count, 1)
