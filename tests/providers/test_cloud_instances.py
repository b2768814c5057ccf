"""The local clouds run real instances: boot scripts as processes, killed on termination and
preemption, spot notices on the metadata server first; through boto3 and google-cloud-compute."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from broker.clock import ManualClock
from providers.local import LocalCloud, LocalInstance
from providers.local.instances import NOTICE_SECONDS
from tests.providers.conftest import gce_client
from tests.providers.test_instances import alive, wait_for

AWS_ZONE, GCP_ZONE = "us-east-1a", "us-central1-a"

# Writes its environment, asks the metadata server what any agent would, keeps a program
# running in a session of its own (as the agent runs the job's command) and waits.
PROBE = r"""#!/bin/bash
echo $$ > bash.pid
python3 - <<'PY'
import json, os, subprocess, urllib.error, urllib.request
base = os.environ["BROKER_METADATA_URL"]
seen = {"env": dict(os.environ)}
def get(path, **headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
token_request = urllib.request.Request(
    base + "/latest/api/token", method="PUT",
    headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
try:
    token = urllib.request.urlopen(token_request).read().decode()
    seen["action"] = get("/latest/meta-data/spot/instance-action",
                         **{"X-aws-ec2-metadata-token": token})
except urllib.error.HTTPError as error:
    seen["action"] = (error.code, "")
seen["preempted"] = get("/computeMetadata/v1/instance/preempted", **{"Metadata-Flavor": "Google"})
program = subprocess.Popen(["sleep", "300"], start_new_session=True)
open("program.pid", "w").write(str(program.pid))
json.dump(seen, open("seen.json", "w"))
PY
sleep 300
"""


@pytest.fixture
def ec2(local_cloud: LocalCloud) -> Any:
    return boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=local_cloud.aws_endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def leak_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets in the broker's environment that no instance may see."""
    monkeypatch.setenv("BROKER_ADMIN_TOKEN", "adm_do_not_leak")
    monkeypatch.setenv("BROKER_AGENT_SECRET", "agent_secret_do_not_leak")


def booted(local_cloud: LocalCloud, instance_id: str) -> tuple[LocalInstance, dict[str, Any]]:
    """The instance's record and what its probe saw, once the probe is done."""
    record = local_cloud.instances.get(instance_id)
    assert record is not None, f"{instance_id} runs no process"
    seen = record.directory / "seen.json"
    wait_for(lambda: seen.exists() and seen.read_text().endswith("}"))
    return record, json.loads(seen.read_text())


def pids(record: LocalInstance) -> list[int]:
    return [int((record.directory / name).read_text()) for name in ("bash.pid", "program.pid")]


def aws_launch(ec2: Any, market: str = "on_demand", user_data: str | None = PROBE) -> str:
    options: dict[str, Any] = {"UserData": user_data} if user_data is not None else {}
    if market == "spot":
        options["InstanceMarketOptions"] = {"MarketType": "spot"}
    reply = ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="p3.8xlarge",
        MinCount=1,
        MaxCount=1,
        Placement={"AvailabilityZone": AWS_ZONE},
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": "broker-job", "Value": "job_probe"}],
            }
        ],
        **options,
    )
    return str(reply["Instances"][0]["InstanceId"])


def aws_state(ec2: Any, instance_id: str) -> dict[str, Any]:
    reply = ec2.describe_instances(InstanceIds=[instance_id])
    return dict(reply["Reservations"][0]["Instances"][0])


def imds(local_cloud: LocalCloud, instance_id: str) -> httpx.Response:
    base = local_cloud.instances.instance_url(instance_id)
    token = httpx.put(
        f"{base}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    ).text
    return httpx.get(
        f"{base}/latest/meta-data/spot/instance-action",
        headers={"X-aws-ec2-metadata-token": token},
    )


def test_run_instances_runs_the_user_data_script_with_the_instance_environment(
    local_cloud: LocalCloud, ec2: Any, leak_guard: None
) -> None:
    instance_id = aws_launch(ec2)
    try:
        record, seen = booted(local_cloud, instance_id)
        env = seen["env"]
        assert env["BROKER_LOCAL_INSTANCE"] == "1"
        assert env["BROKER_INSTANCE_DIR"] == str(record.directory) == env["HOME"]
        assert env["BROKER_METADATA_URL"] == local_cloud.instances.instance_url(instance_id)
        assert env["BROKER_LOCAL_PACE_URL"].endswith(f"/{instance_id}/broker-local/pace")
        assert not {"BROKER_ADMIN_TOKEN", "BROKER_AGENT_SECRET"} & set(env)
        assert "adm_do_not_leak" not in json.dumps(env)
        assert seen["action"] == [404, ""]  # IMDSv2: a token, then no notice yet
        assert seen["preempted"][0] == 404  # an EC2 machine has no GCE metadata
        assert (record.gpu, record.gpu_count, record.tags) == (
            "V100",
            4,
            {"broker-job": "job_probe"},
        )
    finally:
        ec2.terminate_instances(InstanceIds=[instance_id])


def test_terminate_instances_kills_the_whole_process_tree(
    local_cloud: LocalCloud, ec2: Any
) -> None:
    instance_id = aws_launch(ec2)
    record, _ = booted(local_cloud, instance_id)
    processes = pids(record)
    assert all(alive(pid) for pid in processes)
    ec2.terminate_instances(InstanceIds=[instance_id])
    assert not any(alive(pid) for pid in processes)
    assert aws_state(ec2, instance_id)["State"]["Name"] == "terminated"


def test_a_launch_without_user_data_still_works_and_runs_nothing(
    local_cloud: LocalCloud, ec2: Any
) -> None:
    instance_id = aws_launch(ec2, user_data=None)
    resume = aws_launch(ec2, user_data=json.dumps({"not": "a script"}))
    assert local_cloud.instances.get(instance_id) is None
    assert local_cloud.instances.get(resume) is None
    ec2.terminate_instances(InstanceIds=[instance_id, resume])


def test_an_aws_spot_outage_gives_a_notice_then_terminates_after_the_window(
    local_cloud: LocalCloud, ec2: Any, market_clock: ManualClock
) -> None:
    market = local_cloud.market
    market.set_available("aws", AWS_ZONE, "*", True)
    instance_id = aws_launch(ec2, market="spot")
    try:
        record, _ = booted(local_cloud, instance_id)
        processes = pids(record)
        assert imds(local_cloud, instance_id).status_code == 404
        market.set_available("aws", AWS_ZONE, "*", False)
        noticed_at = market.now()
        assert market.step() == 0
        notice = imds(local_cloud, instance_id)
        assert notice.status_code == 200
        reclaim = noticed_at.timestamp() + NOTICE_SECONDS["aws"]
        assert json.loads(notice.text)["action"] == "terminate"
        assert json.loads(notice.text)["time"] == _iso(reclaim)
        market_clock.advance(NOTICE_SECONDS["aws"] - 1)
        assert market.step() == 0
        assert aws_state(ec2, instance_id)["State"]["Name"] == "running"
        assert all(alive(pid) for pid in processes)
        market_clock.advance(1)
        assert market.step() >= 1
        state = aws_state(ec2, instance_id)
        assert state["State"]["Name"] == "terminated"
        assert state["StateReason"]["Code"] == "Server.SpotInstanceTermination"
        assert not any(alive(pid) for pid in processes)
    finally:
        ec2.terminate_instances(InstanceIds=[instance_id])


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def gce(local_cloud: LocalCloud) -> Iterator[compute_v1.InstancesClient]:
    local_cloud.market.set_available("gcp", GCP_ZONE, "*", True)
    yield gce_client(local_cloud)


def gce_launch(client: compute_v1.InstancesClient, project: str, script: str) -> str:
    name = f"broker-probe-{uuid.uuid4().hex[:8]}"
    instance = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{GCP_ZONE}/machineTypes/n1-standard-8",
        labels={"broker-job": "job_probe"},
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=script)]),
        guest_accelerators=[
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{GCP_ZONE}/acceleratorTypes/nvidia-tesla-t4",
                accelerator_count=2,
            )
        ],
        scheduling=compute_v1.Scheduling(
            provisioning_model="SPOT",
            on_host_maintenance="TERMINATE",
            instance_termination_action="DELETE",
        ),
    )
    client.insert(project=project, zone=GCP_ZONE, instance_resource=instance).result()
    return name


# Reports what the GCE metadata says, then waits for the preemption as an agent would.
GCE_PROBE = PROBE.replace(
    "sleep 300\n",
    """python3 - <<'PY'
import os, urllib.request
url = os.environ["BROKER_METADATA_URL"] + "/computeMetadata/v1/instance/preempted"
open("waiting", "w").close()
request = urllib.request.Request(url + "?wait_for_change=true&timeout_sec=25",
                                 headers={"Metadata-Flavor": "Google"})
open("preempted.txt", "w").write(urllib.request.urlopen(request).read().decode())
PY
sleep 300
""",
)


def test_gce_runs_the_startup_script_and_delete_kills_it(
    local_cloud: LocalCloud, gce: compute_v1.InstancesClient, leak_guard: None
) -> None:
    name = gce_launch(gce, local_cloud.gcp_project, PROBE)
    record, seen = booted(local_cloud, name)
    assert seen["env"]["BROKER_METADATA_URL"] == local_cloud.instances.instance_url(name)
    assert not {"BROKER_ADMIN_TOKEN", "BROKER_AGENT_SECRET"} & set(seen["env"])
    assert seen["preempted"] == [200, "FALSE"]
    assert seen["action"][0] == 404  # no IMDS on a GCE machine
    assert (record.gpu, record.gpu_count, record.tags) == ("T4", 2, {"broker-job": "job_probe"})
    processes = pids(record)
    gce.delete(project=local_cloud.gcp_project, zone=GCP_ZONE, instance=name).result()
    assert not any(alive(pid) for pid in processes)


def test_a_gce_spot_outage_wakes_the_waiting_agent_then_preempts_after_30_seconds(
    local_cloud: LocalCloud, gce: compute_v1.InstancesClient, market_clock: ManualClock
) -> None:
    project, market = local_cloud.gcp_project, local_cloud.market
    name = gce_launch(gce, project, GCE_PROBE)
    record, _ = booted(local_cloud, name)
    processes = pids(record)
    waiting, answer = record.directory / "waiting", record.directory / "preempted.txt"
    wait_for(lambda: waiting.exists())
    market.set_available("gcp", GCP_ZONE, "*", False)
    assert market.step() == 0
    wait_for(lambda: answer.exists() and answer.read_text(), timeout=15)  # not the 25 s timeout
    assert answer.read_text() == "TRUE"
    assert gce.get(project=project, zone=GCP_ZONE, instance=name).status == "RUNNING"
    market_clock.advance(NOTICE_SECONDS["gcp"] - 1)
    assert market.step() == 0
    assert all(alive(pid) for pid in processes)
    market_clock.advance(1)
    assert market.step() >= 1
    assert not any(alive(pid) for pid in processes)
    operations = compute_v1.ZoneOperationsClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": local_cloud.gcp_endpoint_url},
    ).list(project=project, zone=GCP_ZONE)
    kinds = {op.operation_type for op in operations if op.target_link.endswith(f"/{name}")}
    assert "compute.instances.preempted" in kinds
    # The disk goes with the machine; the console log stays for a look.
    assert [p.name for p in record.directory.iterdir()] == ["console.log"]
