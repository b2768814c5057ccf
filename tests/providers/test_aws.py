"""AWS adapter details beyond the contract, against the moto server."""

from __future__ import annotations

import base64
import json
import uuid

import boto3
import pytest

from providers.aws import AwsProvider
from providers.base import LaunchRequest, ProviderError
from providers.local import LocalCloud
from providers.retry import FAST_RETRY


@pytest.fixture
def aws(local_cloud: LocalCloud) -> AwsProvider:
    return AwsProvider.from_settings(local_cloud.settings(), retry=FAST_RETRY)


@pytest.fixture
def ec2(local_cloud: LocalCloud):  # noqa: ANN201 - a boto3 client
    return boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=local_cloud.aws_endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _request(market: str = "spot", zone: str = "use1-az1") -> LaunchRequest:
    token = str(uuid.uuid4())
    return LaunchRequest(
        token=token,
        provider="aws",
        region="us-east-1",
        zone=zone,
        instance_type="g4dn.xlarge",
        market=market,  # type: ignore[arg-type]
        gpu="T4",
        tags={"broker-job": "j-7", "broker-attempt": token, "broker-team": "nlp"},
        user_data={"checkpoint_key": "jobs/j-7/ckpt-12", "agent_url": "http://agent"},
    )


def test_zone_ids_resolve_to_zone_names(aws: AwsProvider) -> None:
    assert aws.resolve_zone("us-east-1", "use1-az1") == "us-east-1b"
    assert aws.resolve_zone("us-east-1", "us-east-1c") == "us-east-1c"
    with pytest.raises(ProviderError, match="use1-az99"):
        aws.resolve_zone("us-east-1", "use1-az99")


def test_spot_launch_carries_market_options_tags_and_resume_data(aws: AwsProvider, ec2) -> None:  # noqa: ANN001
    request = _request()
    ref = aws.launch(request)
    try:
        assert ref.zone == "us-east-1b"
        instance = ec2.describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
            "Instances"
        ][0]
        assert instance["InstanceLifecycle"] == "spot"
        assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags == request.tags
        attribute = ec2.describe_instance_attribute(
            InstanceId=ref.instance_id, Attribute="userData"
        )
        user_data = json.loads(base64.b64decode(attribute["UserData"]["Value"]))
        assert user_data == request.user_data
    finally:
        aws.terminate(ref)


def test_on_demand_launch_has_no_spot_lifecycle(aws: AwsProvider, ec2) -> None:  # noqa: ANN001
    ref = aws.launch(_request(market="on_demand"))
    try:
        instance = ec2.describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
            "Instances"
        ][0]
        assert "InstanceLifecycle" not in instance
        assert aws.describe(ref).market == "on_demand"
    finally:
        aws.terminate(ref)


def test_user_termination_is_not_a_preemption(aws: AwsProvider) -> None:
    ref = aws.launch(_request())
    aws.terminate(ref)
    state = aws.describe(ref)
    assert state.status == "terminated"
    assert state.reason == "Client.UserInitiatedShutdown"
