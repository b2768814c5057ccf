"""AWS adapter details beyond the contract, against the moto server."""

from __future__ import annotations

import base64
import dataclasses
import logging
import uuid
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from providers.aws import AwsProvider
from providers.aws_setup import IMAGE_NAMES, SECURITY_GROUP
from providers.base import CapacityError, LaunchRequest, ProviderError
from providers.boot import boot_script
from providers.local import LocalCloud
from providers.retry import FAST_RETRY

# Nothing listens there: the instance's agent fetch fails, which these tests do not watch.
API_URL = "http://127.0.0.1:9"


def _client(cloud: LocalCloud, service: str, region: str = "us-east-1") -> Any:
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=cloud.aws_endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def images(local_cloud_session: LocalCloud) -> dict[str, str]:
    """A Deep Learning Base AMI per architecture, registered in us-east-1 (moto has none)."""
    ec2 = _client(local_cloud_session, "ec2")
    return {
        arch: ec2.register_image(Name=pattern.replace("*", "20250101"), Architecture=arch)[
            "ImageId"
        ]
        for arch, pattern in IMAGE_NAMES.items()
    }


@pytest.fixture
def aws(local_cloud: LocalCloud, images: dict[str, str]) -> AwsProvider:
    # The registered images are the account's own, not Amazon's; the local cloud's own image
    # ids (its settings) are left out so that the lookup by name is what runs.
    return AwsProvider.from_settings(
        local_cloud.settings(), retry=FAST_RETRY, image_owners=["self"], image_ids={}
    )


@pytest.fixture
def ec2(local_cloud: LocalCloud):  # noqa: ANN201 - a boto3 client
    return _client(local_cloud, "ec2")


def _request(
    market: str = "spot", zone: str = "use1-az1", instance_type: str = "g4dn.xlarge"
) -> LaunchRequest:
    token = f"att_{uuid.uuid4().hex[:16]}"
    return LaunchRequest(
        token=token,
        provider="aws",
        region="us-east-1",
        zone=zone,
        instance_type=instance_type,
        market=market,  # type: ignore[arg-type]
        gpu="T4",
        tags={"broker-job": "j-7", "broker-attempt": token, "broker-team": "nlp"},
        boot_script=boot_script(API_URL, token, "att_1.secret", "aws"),
    )


def _instance(ec2: Any, instance_id: str) -> dict[str, Any]:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def test_zone_ids_resolve_to_zone_names(aws: AwsProvider) -> None:
    assert aws.resolve_zone("us-east-1", "use1-az1") == "us-east-1b"
    assert aws.resolve_zone("us-east-1", "us-east-1c") == "us-east-1c"
    with pytest.raises(ProviderError, match="use1-az99"):
        aws.resolve_zone("us-east-1", "use1-az99")


def test_spot_launch_carries_market_options_tags_and_the_boot_script(
    aws: AwsProvider, ec2: Any
) -> None:
    request = _request()
    ref = aws.launch(request)
    try:
        assert ref.zone == "us-east-1b"
        instance = _instance(ec2, ref.instance_id)
        assert instance["InstanceLifecycle"] == "spot"
        assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags == request.tags
        attribute = ec2.describe_instance_attribute(
            InstanceId=ref.instance_id, Attribute="userData"
        )
        assert base64.b64decode(attribute["UserData"]["Value"]).decode() == request.boot_script
    finally:
        aws.terminate(ref)


def test_instances_use_imdsv2_no_inbound_access_and_terminate_on_shutdown(
    aws: AwsProvider, ec2: Any
) -> None:
    ref = aws.launch(_request(market="on_demand"))
    try:
        instance = _instance(ec2, ref.instance_id)
        options = instance["MetadataOptions"]
        assert options["HttpTokens"] == "required"
        assert options["HttpEndpoint"] == "enabled"
        assert options["HttpPutResponseHopLimit"] == 2
        behaviour = ec2.describe_instance_attribute(
            InstanceId=ref.instance_id, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        assert [g["GroupName"] for g in instance["SecurityGroups"]] == [SECURITY_GROUP]
        assert "IamInstanceProfile" not in instance
        group = ec2.describe_security_groups(GroupIds=[instance["SecurityGroups"][0]["GroupId"]])
        assert group["SecurityGroups"][0]["IpPermissions"] == []
    finally:
        aws.terminate(ref)


def test_the_security_group_is_made_once_per_region_and_found_again(
    local_cloud: LocalCloud, images: dict[str, str], ec2: Any
) -> None:
    groups = {
        AwsProvider.from_settings(local_cloud.settings(), retry=FAST_RETRY).setup.security_group(
            "us-east-1"
        )
        for _ in range(2)
    }
    found = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [SECURITY_GROUP]}]
    )["SecurityGroups"]
    assert groups == {found[0]["GroupId"]} and len(found) == 1
    west = _client(local_cloud, "ec2", "us-west-2")
    other = AwsProvider.from_settings(local_cloud.settings()).setup.security_group("us-west-2")
    assert other not in groups
    assert west.describe_security_groups(GroupIds=[other])["SecurityGroups"][0]["VpcId"]


def test_instances_get_the_instance_profile_when_one_is_set(
    local_cloud: LocalCloud, images: dict[str, str], ec2: Any
) -> None:
    name = f"broker-instances-{uuid.uuid4().hex[:6]}"
    _client(local_cloud, "iam").create_instance_profile(InstanceProfileName=name)
    aws = AwsProvider.from_settings(
        local_cloud.settings(), retry=FAST_RETRY, image_owners=["self"], instance_profile=name
    )
    ref = aws.launch(_request(market="on_demand"))
    try:
        assert _instance(ec2, ref.instance_id)["IamInstanceProfile"]["Arn"].endswith(
            f"instance-profile/{name}"
        )
        assert aws.instance_profile_arn(name).endswith(name)
        with pytest.raises(ProviderError, match="NoSuchEntity"):
            aws.instance_profile_arn("no-such-profile")
    finally:
        aws.terminate(ref)


@pytest.mark.parametrize(
    ("instance_type", "architecture"), [("g5g.xlarge", "arm64"), ("p3.2xlarge", "x86_64")]
)
def test_the_image_follows_the_instance_types_architecture(
    aws: AwsProvider, ec2: Any, images: dict[str, str], instance_type: str, architecture: str
) -> None:
    assert aws.setup.architecture("us-east-1", instance_type) == architecture
    ref = aws.launch(_request(market="on_demand", instance_type=instance_type))
    try:
        assert _instance(ec2, ref.instance_id)["ImageId"] == images[architecture]
    finally:
        aws.terminate(ref)


def test_configured_images_win_per_region_then_per_architecture(local_cloud: LocalCloud) -> None:
    aws = AwsProvider.from_settings(
        local_cloud.settings(),
        retry=FAST_RETRY,
        image_ids={"us-east-1/arm64": "ami-0e9271c829888680e", "arm64": "ami-aaaa"},
    )
    assert aws.setup.image("us-east-1", "arm64") == "ami-0e9271c829888680e"
    assert aws.setup.image("us-west-2", "arm64") == "ami-aaaa"


def test_no_image_found_says_how_to_configure_one(local_cloud: LocalCloud) -> None:
    aws = AwsProvider.from_settings(  # Amazon's images only, and none configured
        local_cloud.settings(), retry=FAST_RETRY, image_ids={}
    )
    with pytest.raises(ProviderError, match="BROKER_AWS_IMAGE_IDS") as refused:
        aws.launch(_request(instance_type="g5g.xlarge"))
    assert "arm64" in str(refused.value) and "us-east-1/arm64" in str(refused.value)


def test_on_demand_launch_has_no_spot_lifecycle(aws: AwsProvider, ec2: Any) -> None:
    ref = aws.launch(_request(market="on_demand"))
    try:
        assert "InstanceLifecycle" not in _instance(ec2, ref.instance_id)
        assert aws.describe(ref).market == "on_demand"
    finally:
        aws.terminate(ref)


def test_user_termination_is_not_a_preemption(aws: AwsProvider) -> None:
    ref = aws.launch(_request())
    aws.terminate(ref)
    state = aws.describe(ref)
    assert state.status == "terminated"
    assert state.reason == "Client.UserInitiatedShutdown"


def test_describe_many_asks_only_for_the_status_of_up_instances(
    local_cloud: LocalCloud, images: dict[str, str]
) -> None:
    """The control loop's describe: up instances cost one small DescribeInstanceStatus per
    ``describe_batch`` ids; only an instance that is not up is described in full, so a user
    termination keeps its reason, and an id EC2 no longer knows comes back None."""
    batched = AwsProvider.from_settings(
        local_cloud.settings(), retry=FAST_RETRY, image_owners=["self"], describe_batch=2
    )
    operations: list[str] = []
    client = batched._client("us-east-1")
    client.meta.events.register(
        "before-call.ec2.*", lambda model, **_: operations.append(model.name)
    )
    up = [batched.launch(_request()) for _ in range(3)]
    ended = batched.launch(_request(market="on_demand"))
    try:
        batched.terminate(ended)
        operations.clear()
        states = batched.describe_many(up)
        assert [states[ref].status for ref in up] == ["running"] * 3  # type: ignore[union-attr]
        assert operations == ["DescribeInstanceStatus"] * 2

        operations.clear()
        gone = dataclasses.replace(ended, instance_id="i-0123456789abcdef0")
        states = batched.describe_many([ended, gone])
        assert states[ended] is not None
        assert (states[ended].status, states[ended].reason) == (
            "terminated",
            "Client.UserInitiatedShutdown",
        )
        assert states[gone] is None
        # the unknown id fails its status call; both ids are then described in full
        assert operations == ["DescribeInstanceStatus", "DescribeInstances"]
    finally:
        for ref in up:
            batched.terminate(ref)


def test_the_agent_token_stays_out_of_botocores_debug_logs(
    aws: AwsProvider, caplog: pytest.LogCaptureFixture
) -> None:
    request = _request(market="on_demand")
    caplog.set_level(logging.DEBUG, logger="botocore")
    ref = aws.launch(request)
    aws.terminate(ref)
    encoded = base64.b64encode(request.boot_script.encode()).decode()
    assert "user data omitted" in caplog.text
    assert "att_1.secret" not in caplog.text and encoded[:60] not in caplog.text


def test_a_gangs_placement_group_is_made_once_and_its_instances_launch_into_it(
    local_cloud: LocalCloud, images: dict[str, str], ec2: Any
) -> None:
    name = f"broker-gang-{uuid.uuid4().hex[:8]}"
    refs = []
    try:
        for _ in range(2):  # two adapters (two workers): the second finds the group made
            aws = AwsProvider.from_settings(
                local_cloud.settings(), retry=FAST_RETRY, image_owners=["self"], image_ids={}
            )
            request = dataclasses.replace(_request(market="on_demand"), placement_group=name)
            refs.append(aws.launch(request))
        groups = ec2.describe_placement_groups(GroupNames=[name])["PlacementGroups"]
        assert [(g["GroupName"], g["Strategy"]) for g in groups] == [(name, "cluster")]
        with pytest.raises(ClientError, match="InvalidPlacementGroup.Unknown"):
            ec2.run_instances(  # as EC2, the local cloud refuses a group that does not exist
                ImageId=images["x86_64"],
                InstanceType="g4dn.xlarge",
                MinCount=1,
                MaxCount=1,
                Placement={"GroupName": "no-such-group"},
            )
    finally:
        for ref in refs:
            aws.terminate(ref)


def test_the_local_zone_refuses_launches_past_its_capacity(
    local_cloud: LocalCloud, aws: AwsProvider
) -> None:
    local_cloud.aws.set_capacity("us-east-1b", "g4dn.xlarge", 1)
    first = aws.launch(_request(market="on_demand"))
    try:
        with pytest.raises(CapacityError, match="sufficient g4dn.xlarge capacity"):
            aws.launch(_request(market="on_demand"))
        aws.terminate(first)
        second = aws.launch(_request(market="on_demand"))  # room again once it is gone
        aws.terminate(second)
    finally:
        local_cloud.aws.set_capacity("us-east-1b", "g4dn.xlarge", None)
        aws.terminate(first)


def test_a_terminated_instance_is_forgotten_an_hour_later_as_ec2_does(
    ec2: Any, local_cloud: LocalCloud, market_clock: Any
) -> None:
    """EC2 lists a terminated instance for about an hour; the local cloud forgets it (and its
    tags) an hour of market time after it ended, so long runs' DescribeInstances stay cheap."""
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def launch() -> str:
        reply = ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType="t3.micro",
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": "reaper-test", "Value": "1"}]}
            ],
        )
        return str(reply["Instances"][0]["InstanceId"])

    def listed() -> set[str]:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": ["reaper-test"]}]
        )
        return {i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]}

    ended, running = launch(), launch()
    ec2.terminate_instances(InstanceIds=[ended])
    local_cloud.market.step()  # the reaper first sees it terminated
    market_clock.advance(50 * 60)
    local_cloud.market.step()
    assert listed() == {ended, running}  # still listed within the hour
    market_clock.advance(15 * 60)
    local_cloud.market.step()
    assert listed() == {running}
    assert (
        ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [ended]}])["Reservations"]
        == []
    )
    ec2.terminate_instances(InstanceIds=[running])
