"""Session-wide local clouds (moto server + GCE fake + market replay) and provider cases."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from broker.clock import ManualClock
from providers.aws import AwsProvider
from providers.base import InstanceRef, LaunchRequest, Market, Provider
from providers.gcp import GcpProvider
from providers.local import LocalCloud
from providers.retry import FAST_RETRY

GCP_ZONES = ["us-central1-a", "us-central1-b", "us-east1-b"]
AWS_REGIONS = ["us-east-1", "us-west-2"]


@pytest.fixture(scope="session")
def market_clock() -> ManualClock:
    """The clock of the market replay and the GCE fake; tests move it explicitly."""
    return ManualClock(datetime(2024, 3, 1, tzinfo=UTC))


@pytest.fixture(scope="session")
def local_cloud_session(market_clock: ManualClock) -> Iterator[LocalCloud]:
    with LocalCloud(
        aws_regions=AWS_REGIONS,
        gcp_zones=GCP_ZONES,
        market_interval_seconds=None,  # tests call market.step() themselves
        clock=market_clock,
        fault_seed=1234,
    ) as cloud:
        yield cloud


@pytest.fixture
def local_cloud(local_cloud_session: LocalCloud) -> Iterator[LocalCloud]:
    """The shared local cloud, with faults and market overrides reset after each test."""
    yield local_cloud_session
    local_cloud_session.faults.reset()
    local_cloud_session.market.clear_overrides()


@dataclass
class ProviderCase:
    """One cloud under the contract suite, with what a test needs to drive it."""

    provider: Provider
    region: str
    zone: str  # as the catalog gives it (AWS: a zone id)
    market_zone: str  # as the market and the cloud name it
    instance_type: str
    gpu: str
    other_region: str
    other_zone: str
    launch_unmanaged: Callable[[], str]
    raw_managed: Callable[[str], set[str]]  # instance ids carrying broker-job, via the raw client
    launched: list[InstanceRef] = field(default_factory=list)

    def request(self, market: Market = "spot", **changes: object) -> LaunchRequest:
        token = str(uuid.uuid4())
        values: dict[str, object] = {
            "token": token,
            "provider": self.provider.name,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "market": market,
            "gpu": self.gpu,
            "gpu_count": 1,
            "tags": {"broker-job": "job-1", "broker-attempt": token, "broker-team": "Vision"},
            "boot_script": "",
        }
        values.update(changes)
        return LaunchRequest(**values)  # type: ignore[arg-type]


def _aws_case(cloud: LocalCloud) -> ProviderCase:
    provider = AwsProvider.from_settings(cloud.settings(), retry=FAST_RETRY)
    ec2 = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=cloud.aws_endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )

    def launch_unmanaged() -> str:
        reply = ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="t3.micro",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "other"}]}
            ],
        )
        return reply["Instances"][0]["InstanceId"]

    def raw_managed(region: str) -> set[str]:
        client = (
            ec2
            if region == "us-east-1"
            else boto3.client(
                "ec2",
                region_name=region,
                endpoint_url=cloud.aws_endpoint_url,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        )
        found = set()
        pages = client.get_paginator("describe_instances").paginate()  # moto: 100 a page
        for reservation in (r for page in pages for r in page["Reservations"]):
            for instance in reservation["Instances"]:
                keys = {t["Key"] for t in instance.get("Tags", [])}
                if "broker-job" in keys and instance["State"]["Name"] != "terminated":
                    found.add(instance["InstanceId"])
        return found

    return ProviderCase(
        provider=provider,
        region="us-east-1",
        zone="use1-az6",  # moto's id of us-east-1a
        market_zone="us-east-1a",
        instance_type="p3.2xlarge",
        gpu="V100",
        other_region="us-west-2",
        other_zone="us-west-2a",
        launch_unmanaged=launch_unmanaged,
        raw_managed=raw_managed,
    )


def gce_client(cloud: LocalCloud) -> compute_v1.InstancesClient:
    """A plain InstancesClient pointed at the fake."""
    return compute_v1.InstancesClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": cloud.gcp_endpoint_url},
    )


def _gcp_case(cloud: LocalCloud) -> ProviderCase:
    provider = GcpProvider.from_settings(cloud.settings(), retry=FAST_RETRY)
    client = gce_client(cloud)

    def launch_unmanaged() -> str:
        name = f"other-{uuid.uuid4().hex[:8]}"
        instance = compute_v1.Instance(
            name=name,
            machine_type="zones/us-central1-a/machineTypes/n1-standard-1",
            labels={"team": "other"},
        )
        client.insert(project=cloud.gcp_project, zone="us-central1-a", instance_resource=instance)
        return name

    def raw_managed(region: str) -> set[str]:
        found = set()
        for key, scoped in client.aggregated_list(project=cloud.gcp_project):
            if key.rsplit("/", 1)[-1].startswith(region + "-"):
                found |= {i.name for i in scoped.instances if "broker-job" in i.labels}
        return found

    return ProviderCase(
        provider=provider,
        region="us-central1",
        zone="us-central1-a",
        market_zone="us-central1-a",
        instance_type="n1-standard-8",
        gpu="V100",
        other_region="us-east1",
        other_zone="us-east1-b",
        launch_unmanaged=launch_unmanaged,
        raw_managed=raw_managed,
    )


@pytest.fixture(scope="session")
def provider_cases(local_cloud_session: LocalCloud) -> dict[str, ProviderCase]:
    return {"aws": _aws_case(local_cloud_session), "gcp": _gcp_case(local_cloud_session)}


@pytest.fixture(params=["aws", "gcp"])
def case(
    request: pytest.FixtureRequest, provider_cases: dict[str, ProviderCase], local_cloud: LocalCloud
) -> Iterator[ProviderCase]:
    """Each contract test runs once against AWS-on-moto and once against GCP-on-fake."""
    chosen = provider_cases[request.param]
    local_cloud.market.set_available(chosen.provider.name, chosen.market_zone, "*", True)
    local_cloud.market.set_available(chosen.provider.name, chosen.other_zone, "*", True)
    yield chosen
    local_cloud.faults.reset()
    for ref in chosen.launched:
        chosen.provider.terminate(ref)
    chosen.launched.clear()
