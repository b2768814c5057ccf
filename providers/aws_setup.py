"""What an EC2 launch needs besides the request: the instance type's architecture, an image
for a region and architecture, and the instances' security group.

Each is looked up once per region and kept for the life of the provider. The instances
talk only outwards (to the broker's API and the checkpoint store), so their security group
has no inbound rule at all.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from providers.aws_errors import error_code
from providers.base import ProviderError

Call = Callable[[str, Callable[[], Any]], Any]

X86_64 = "x86_64"
ARM64 = "arm64"
# AWS's Deep Learning Base AMIs with the open-source NVIDIA driver, Docker and the NVIDIA
# container toolkit: the agent runs the program in its image with ``docker run --gpus all``.
IMAGE_NAMES = {
    X86_64: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
    ARM64: "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
}
SECURITY_GROUP = "broker-instances"


class LaunchSetup:
    """Architectures, images and the security group of one account's regions, cached.

    ``client(region)`` gives the region's EC2 client; ``call(action, fn)`` runs one boto3
    call with the provider's retries and error mapping.
    """

    def __init__(
        self,
        client: Callable[[str], Any],
        call: Call,
        *,
        image_ids: Mapping[str, str] | None = None,
        image_owners: Sequence[str] = ("amazon",),
        image_names: Mapping[str, str] = IMAGE_NAMES,
    ) -> None:
        self._client = client
        self._call = call
        self.image_ids = dict(image_ids or {})
        self.image_owners = list(image_owners)
        self.image_names = dict(image_names)
        self._arm64: dict[str, frozenset[str]] = {}
        self._images: dict[tuple[str, str], str] = {}
        self._groups: dict[str, str] = {}
        self._lock = threading.Lock()

    def architecture(self, region: str, instance_type: str) -> str:
        """``arm64`` for a Graviton type (``g5g.xlarge``), else ``x86_64``."""
        return ARM64 if instance_type in self._arm64_types(region) else X86_64

    def image(self, region: str, architecture: str) -> str:
        """The AMI for ``architecture`` in ``region``: the configured one, else the newest
        image of the owners whose name matches the architecture's pattern."""
        for key in (f"{region}/{architecture}", architecture):
            if key in self.image_ids:
                return self.image_ids[key]
        with self._lock:
            known = self._images.get((region, architecture))
        if known:
            return known
        pattern = self.image_names.get(architecture)
        override = json.dumps({f"{region}/{architecture}": "ami-..."})
        if pattern is None:
            raise ProviderError(
                f"no image for {architecture} in {region}: set BROKER_AWS_IMAGE_IDS='{override}'"
            )
        client = self._client(region)
        reply = self._call(
            "DescribeImages",
            lambda: client.describe_images(
                Owners=self.image_owners,
                Filters=[
                    {"Name": "name", "Values": [pattern]},
                    {"Name": "state", "Values": ["available"]},
                ],
            ),
        )
        # Some endpoints leave an image's architecture out; the name pattern already says it.
        images = [
            i for i in reply.get("Images", []) if i.get("Architecture") in (None, "", architecture)
        ]
        if not images:
            raise ProviderError(
                f"no {architecture} image named {pattern!r} owned by "
                f"{', '.join(self.image_owners)} in {region}: "
                f"set BROKER_AWS_IMAGE_IDS='{override}'"
            )
        newest = max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]
        with self._lock:
            self._images[(region, architecture)] = newest
        return str(newest)

    def security_group(self, region: str) -> str:
        """The id of ``broker-instances`` in the region's default VPC, created if missing."""
        with self._lock:
            known = self._groups.get(region)
        if known:
            return known
        client = self._client(region)
        vpcs = self._call(
            "DescribeVpcs",
            lambda: client.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}]),
        ).get("Vpcs", [])
        if not vpcs:
            raise ProviderError(
                f"no default VPC in {region}: create one with "
                f"`aws ec2 create-default-vpc --region {region}`"
            )
        vpc_id = vpcs[0]["VpcId"]
        group = self._find_group(client, vpc_id) or self._create_group(client, vpc_id)
        with self._lock:
            self._groups[region] = group
        return group

    def _arm64_types(self, region: str) -> frozenset[str]:
        with self._lock:
            known = self._arm64.get(region)
        if known is not None:
            return known
        client = self._client(region)

        def fetch() -> list[dict[str, Any]]:
            pages = client.get_paginator("describe_instance_types").paginate(
                Filters=[{"Name": "processor-info.supported-architecture", "Values": [ARM64]}]
            )
            return [item for page in pages for item in page.get("InstanceTypes", [])]

        types = self._call("DescribeInstanceTypes", fetch)
        known = frozenset(
            t["InstanceType"]
            for t in types
            if X86_64 not in t.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
        )
        with self._lock:
            self._arm64[region] = known
        return known

    def _find_group(self, client: Any, vpc_id: str) -> str | None:
        reply = self._call(
            "DescribeSecurityGroups",
            lambda: client.describe_security_groups(
                Filters=[
                    {"Name": "group-name", "Values": [SECURITY_GROUP]},
                    {"Name": "vpc-id", "Values": [vpc_id]},
                ]
            ),
        )
        groups = reply.get("SecurityGroups", [])
        return str(groups[0]["GroupId"]) if groups else None

    def _create_group(self, client: Any, vpc_id: str) -> str:
        def create() -> str | None:
            try:
                reply = client.create_security_group(
                    GroupName=SECURITY_GROUP,
                    Description="GPU broker instances: outbound only, no inbound access",
                    VpcId=vpc_id,
                )
            except ClientError as exc:
                if error_code(exc) != "InvalidGroup.Duplicate":
                    raise
                return None  # another worker made it first
            return str(reply["GroupId"])

        created = self._call("CreateSecurityGroup", create)
        group = created or self._find_group(client, vpc_id)
        if group is None:
            raise ProviderError(f"security group {SECURITY_GROUP} vanished in {vpc_id}")
        return group
