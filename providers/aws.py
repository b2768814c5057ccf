"""AWS EC2 behind the Provider protocol, through boto3 (any endpoint: AWS or the moto server).

``launched_at`` is EC2's ``LaunchTime`` (wall time as the endpoint reports it); the
lifecycle bills from the broker's clock, so only use it to order or display launches.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import boto3
import botocore.session
import botocore.utils
from botocore.config import Config

from broker import clock
from broker.settings import Settings
from providers.aws_errors import call_aws
from providers.aws_setup import IMAGE_NAMES, LaunchSetup
from providers.base import (
    MANAGED_TAG,
    REASON_SPOT_PREEMPTED,
    TAG_ATTEMPT,
    InstanceNotFound,
    InstanceRef,
    InstanceState,
    LaunchRequest,
    ManagedInstance,
    ProviderError,
)
from providers.retry import RetryPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")

SPOT_TERMINATION_CODE = "Server.SpotInstanceTermination"
# IMDSv2 only; two hops so a program in a docker container on the instance still reaches it.
METADATA_OPTIONS = {
    "HttpTokens": "required",
    "HttpEndpoint": "enabled",
    "HttpPutResponseHopLimit": 2,
}
_LISTED_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]
# DescribeInstances: at most 1000 results a page; ids go in an ``instance-id`` filter (an
# unknown id there is no error, unlike InstanceIds), 100 values a call, under EC2's 200.
# DescribeInstanceStatus takes at most 100 InstanceIds (and has no instance-id filter).
PAGE_SIZE = 1000
IDS_PER_CALL = 100
_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


# botocore logs every request's parameters ("Making request for ... with params") and every
# response body at DEBUG. EC2 user data carries the attempt's agent token (the boot script,
# base64-encoded, which no token pattern of the log handlers recognises), so its value is cut
# out of those records before any handler sees them.
_USER_DATA = re.compile(r"(?i)([\"']?user_?data[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9+/=%]+")
_USER_DATA_XML = re.compile(r"(?i)(<userData>\s*<value>)[^<]*")
_MENTIONS_USER_DATA = re.compile(r"(?i)user_?data")
_BOTOCORE_LOGGERS = ("botocore.endpoint", "botocore.parsers")


class _HideUserData(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return True
        if _MENTIONS_USER_DATA.search(message):
            message = _USER_DATA.sub(r"\1[user data omitted]", message)
            record.msg, record.args = _USER_DATA_XML.sub(r"\1[user data omitted]", message), None
        return True


_HIDE_USER_DATA = _HideUserData()


def hide_user_data_in_botocore_logs() -> None:
    """Keep EC2 user data (and the agent token in it) out of botocore's DEBUG records."""
    for name in _BOTOCORE_LOGGERS:
        logging.getLogger(name).addFilter(_HIDE_USER_DATA)  # once: the same filter object


hide_user_data_in_botocore_logs()


def parse_timestamp(value: Any) -> datetime:
    """A response timestamp: ISO 8601 by the standard library (UTC when it names no zone),
    anything else (epoch seconds, RFC 822) as botocore parses it."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return botocore.utils.parse_timestamp(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def client_token(token: str) -> str:
    """The EC2 ``ClientToken`` for an attempt id (at most 64 ASCII characters)."""
    if len(token) <= 64 and token.isascii() and token.isprintable():
        return token
    return hashlib.sha256(token.encode()).hexdigest()[:64]


class AwsProvider:
    """EC2 instances for the broker: one boto3 client per region, retried on transient errors.

    Instances boot the request's script as user data, from the image for their region and
    architecture (``aws_setup``), with IMDSv2 only, in the ``broker-instances`` security
    group (no inbound rule), with ``instance_profile`` when given, and terminate when they
    shut themselves down.
    """

    name = "aws"

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        regions: Sequence[str] = ("us-east-1",),
        image_ids: Mapping[str, str] | None = None,
        image_owners: Sequence[str] = ("amazon",),
        image_names: Mapping[str, str] = IMAGE_NAMES,
        instance_profile: str | None = None,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        describe_batch: int = IDS_PER_CALL,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region_names = list(regions)
        self.instance_profile = instance_profile
        self.describe_batch = describe_batch
        core = botocore.session.get_session()
        # botocore parses every timestamp with dateutil: a third of a 100-instance
        # DescribeInstances' CPU. EC2 sends ISO 8601, which the standard library parses.
        core.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=parse_timestamp
        )
        self._session = boto3.session.Session(
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            botocore_session=core,
        )
        # Retries are ours (tenacity), so botocore must not retry underneath them.
        self._config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self._retry = retry or RetryPolicy()
        self._clients: dict[tuple[str, str], Any] = {}
        self._zones: dict[str, dict[str, str]] = {}
        self._placement_groups: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.setup = LaunchSetup(
            self._client,
            self._call,
            image_ids=image_ids,
            image_owners=image_owners,
            image_names=image_names,
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AwsProvider:
        """Build from ``BROKER_AWS_*`` settings; keyword overrides win."""
        secret = settings.aws_secret_access_key
        options: dict[str, Any] = {
            "endpoint_url": settings.aws_endpoint_url,
            "access_key_id": settings.aws_access_key_id,
            "secret_access_key": secret.get_secret_value() if secret else None,
            "regions": settings.aws_regions,
            "image_ids": settings.aws_image_ids,
            "image_owners": settings.aws_image_owners,
            "instance_profile": settings.aws_instance_profile,
        }
        options.update(overrides)
        return cls(**options)

    def launch(self, request: LaunchRequest) -> InstanceRef:
        """RunInstances with a ClientToken from the attempt id (a repeat returns the same one)."""
        zone = self.resolve_zone(request.region, request.zone)
        architecture = self.setup.architecture(request.region, request.instance_type)
        tags = {TAG_ATTEMPT: request.token, **request.tags}
        tag_list = [{"Key": k, "Value": str(v)} for k, v in tags.items()]
        params: dict[str, Any] = {
            "ImageId": self.setup.image(request.region, architecture),
            "InstanceType": request.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(request.token),
            "Placement": {"AvailabilityZone": zone},
            "SecurityGroupIds": [self.setup.security_group(request.region)],
            "MetadataOptions": METADATA_OPTIONS,
            # The boot script's power-off backstop then ends the bill.
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        }
        if request.placement_group:
            self.placement_group(request.region, request.placement_group)
            params["Placement"]["GroupName"] = request.placement_group
        if request.boot_script:
            params["UserData"] = request.boot_script  # boto3 base64-encodes it
        if self.instance_profile:
            params["IamInstanceProfile"] = {"Name": self.instance_profile}
        if request.market == "spot":
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        client = self._client(request.region)
        reply = self._call("RunInstances", lambda: client.run_instances(**params))
        instance = reply["Instances"][0]
        logger.info(
            "launched EC2 instance",
            extra={"attempt_id": request.token, "instance_id": instance["InstanceId"]},
        )
        return InstanceRef("aws", request.region, zone, instance["InstanceId"])

    def placement_group(self, region: str, name: str) -> None:
        """Make sure the cluster placement group ``name`` exists in ``region`` (a gang's
        instances launch into it, close together); created once, an existing one is kept."""
        with self._lock:
            if (region, name) in self._placement_groups:
                return
        client = self._client(region)
        try:
            self._call(
                "CreatePlacementGroup",
                lambda: client.create_placement_group(
                    GroupName=name,
                    Strategy="cluster",
                    TagSpecifications=[
                        {
                            "ResourceType": "placement-group",
                            "Tags": [{"Key": MANAGED_TAG, "Value": "gang"}],
                        }
                    ],
                ),
            )
        except ProviderError as error:
            if "InvalidPlacementGroup.Duplicate" not in str(error):
                raise
        with self._lock:
            self._placement_groups.add((region, name))

    def describe(self, ref: InstanceRef) -> InstanceState:
        """Status from DescribeInstances; a spot interruption shows as ``preempted``."""
        client = self._client(ref.region)
        reply = self._call(
            "DescribeInstances", lambda: client.describe_instances(InstanceIds=[ref.instance_id])
        )
        instances = [i for r in reply.get("Reservations", []) for i in r.get("Instances", [])]
        if not instances:
            raise InstanceNotFound(f"EC2 instance {ref.instance_id} not found in {ref.region}")
        return instance_state(instances[0])

    def terminate(self, ref: InstanceRef) -> None:
        """TerminateInstances; an instance already gone counts as terminated."""
        client = self._client(ref.region)
        try:
            self._call(
                "TerminateInstances",
                lambda: client.terminate_instances(InstanceIds=[ref.instance_id]),
            )
        except InstanceNotFound:
            logger.info("EC2 instance already gone", extra={"instance_id": ref.instance_id})

    def describe_many(self, refs: Sequence[InstanceRef]) -> dict[InstanceRef, InstanceState | None]:
        """Per region, DescribeInstanceStatus for ``describe_batch`` ids a call (a small
        reply: an up instance needs no more), then DescribeInstances for the ids it did not
        show up (ended, stopping, unknown: their reason tells a preemption apart). An up
        instance's state has no launch time, tags or market; None for an unknown id."""
        found: dict[InstanceRef, InstanceState | None] = {ref: None for ref in refs}
        by_region: dict[str, dict[str, InstanceRef]] = {}
        for ref in refs:
            by_region.setdefault(ref.region, {})[ref.instance_id] = ref
        for region, wanted in by_region.items():
            ids = sorted(wanted)
            rest: list[str] = []
            for start in range(0, len(ids), self.describe_batch):
                chunk = ids[start : start + self.describe_batch]
                try:
                    states = self._statuses(region, chunk)
                except InstanceNotFound:  # an id EC2 no longer knows fails the whole call
                    rest.extend(chunk)
                    continue
                for instance_id in chunk:
                    name = states.get(instance_id)
                    if name in ("pending", "running"):
                        found[wanted[instance_id]] = InstanceState(name, None, None)
                    else:
                        rest.append(instance_id)
            for start in range(0, len(rest), self.describe_batch):
                values = rest[start : start + self.describe_batch]
                chunk_filter = [{"Name": "instance-id", "Values": values}]
                for instance in self._instances(region, chunk_filter):
                    match = wanted.get(instance["InstanceId"])
                    if match is not None:
                        found[match] = instance_state(instance)
        return found

    def _statuses(self, region: str, ids: list[str]) -> dict[str, str]:
        """Instance id to state name (``running``, ``terminated``...) from one
        DescribeInstanceStatus (every state, not only running); ``InstanceNotFound`` when
        EC2 does not know one of ``ids``."""
        client = self._client(region)
        reply = self._call(
            "DescribeInstanceStatus",
            lambda: client.describe_instance_status(InstanceIds=ids, IncludeAllInstances=True),
        )
        return {
            item["InstanceId"]: item.get("InstanceState", {}).get("Name", "")
            for item in reply.get("InstanceStatuses", [])
        }

    def regions(self) -> list[str]:
        """The regions of ``BROKER_AWS_REGIONS``."""
        return list(self.region_names)

    def list_managed(self, region: str) -> list[ManagedInstance]:
        """Every instance in ``region`` carrying the broker's tag, except terminated ones,
        with its state: one DescribeInstances per page of ``PAGE_SIZE``."""
        filters = [
            {"Name": "tag-key", "Values": [MANAGED_TAG]},
            {"Name": "instance-state-name", "Values": _LISTED_STATES},
        ]
        return [
            ManagedInstance(
                "aws",
                region,
                instance.get("Placement", {}).get("AvailabilityZone", ""),
                instance["InstanceId"],
                state=instance_state(instance),
            )
            for instance in self._instances(region, filters)
        ]

    def _instances(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every DescribeInstances item that passes ``filters``, a page at a time."""
        client = self._client(region)

        def pages() -> list[dict[str, Any]]:
            paginator = client.get_paginator("describe_instances")
            pager = paginator.paginate(Filters=filters, PaginationConfig={"PageSize": PAGE_SIZE})
            return list(pager)

        return [
            instance
            for page in self._call("DescribeInstances", pages)
            for reservation in page.get("Reservations", [])
            for instance in reservation.get("Instances", [])
        ]

    def resolve_zone(self, region: str, zone: str) -> str:
        """The zone name for a zone name or zone id (``use1-az2``), looked up once per region."""
        with self._lock:
            known = self._zones.get(region)
        if known is None:
            client = self._client(region)
            reply = self._call(
                "DescribeAvailabilityZones", lambda: client.describe_availability_zones()
            )
            known = {}
            for item in reply.get("AvailabilityZones", []):
                known[item["ZoneName"]] = item["ZoneName"]
                if item.get("ZoneId"):
                    known[item["ZoneId"]] = item["ZoneName"]
            with self._lock:
                self._zones[region] = known
        if zone not in known:
            raise ProviderError(f"zone {zone!r} is not a zone name or zone id of {region}")
        return known[zone]

    # -- account checks (``broker doctor``) ----------------------------------------------

    def caller_identity(self) -> str:
        """The ARN the credentials belong to (STS GetCallerIdentity)."""
        sts = self._client(self._home_region(), "sts")
        return str(self._call("GetCallerIdentity", sts.get_caller_identity)["Arn"])

    def instance_profile_arn(self, name: str) -> str:
        """The ARN of the IAM instance profile ``name``; ``ProviderError`` if there is none."""
        iam = self._client(self._home_region(), "iam")
        reply = self._call(
            "GetInstanceProfile", lambda: iam.get_instance_profile(InstanceProfileName=name)
        )
        return str(reply["InstanceProfile"]["Arn"])

    def probe_bucket(self, bucket: str, region: str) -> str:
        """Put and delete one small object in ``bucket``; returns the key it used."""
        s3 = self._client(region, "s3")
        key = f"broker-doctor/probe-{uuid.uuid4().hex}"
        self._call("PutObject", lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"probe"))
        self._call("DeleteObject", lambda: s3.delete_object(Bucket=bucket, Key=key))
        return key

    def _home_region(self) -> str:
        return self.region_names[0] if self.region_names else "us-east-1"

    def _client(self, region: str, service: str = "ec2") -> Any:
        with self._lock:
            if (service, region) not in self._clients:
                config = self._config
                if service == "s3":  # as the checkpoint store addresses it (any endpoint)
                    config = config.merge(Config(s3={"addressing_style": "path"}))
                self._clients[(service, region)] = self._session.client(
                    service, region_name=region, endpoint_url=self.endpoint_url, config=config
                )
            return self._clients[(service, region)]

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        return call_aws(self._retry, action, fn)


def instance_state(instance: dict[str, Any]) -> InstanceState:
    """An ``InstanceState`` from one DescribeInstances item."""
    state = instance.get("State", {}).get("Name", "pending")
    reason_code = instance.get("StateReason", {}).get("Code") or None
    transition = instance.get("StateTransitionReason") or ""
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    market = "spot" if instance.get("InstanceLifecycle") == "spot" else "on_demand"
    launched_at = instance.get("LaunchTime") or clock.now()
    launched_at = (
        launched_at.replace(tzinfo=UTC) if launched_at.tzinfo is None else launched_at
    ).astimezone(UTC)
    if state in ("pending", "running"):
        return InstanceState(state, None, launched_at, None, tags, market)
    ended_at = None
    match = _REASON_TIME.search(transition)
    if match:
        ended_at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    if reason_code == SPOT_TERMINATION_CODE:
        return InstanceState(
            "preempted", REASON_SPOT_PREEMPTED, launched_at, ended_at, tags, market
        )
    return InstanceState(
        "terminated", reason_code or transition or state, launched_at, ended_at, tags, market
    )
