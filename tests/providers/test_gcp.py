"""GCP adapter and GCE fake details beyond the contract, through google-cloud-compute."""

from __future__ import annotations

import uuid

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from broker.clock import ManualClock
from providers.base import LaunchRequest, ProviderError
from providers.boot import boot_script
from providers.gcp import GcpProvider
from providers.gcp_instance import STORAGE_SCOPE, architecture, instance_resource
from providers.local import LocalCloud
from providers.local.instances import NOTICE_SECONDS
from providers.retry import FAST_RETRY
from tests.providers.conftest import gce_client

ZONE = "us-central1-b"


@pytest.fixture
def gcp(local_cloud: LocalCloud) -> GcpProvider:
    local_cloud.market.set_available("gcp", ZONE, "*", True)
    return GcpProvider.from_settings(local_cloud.settings(), retry=FAST_RETRY)


def _request(
    instance_type: str = "n1-standard-8", gpu: str = "V100", count: int = 2
) -> LaunchRequest:
    token = f"Attempt-{uuid.uuid4()}"
    return LaunchRequest(
        token=token,
        provider="gcp",
        region="us-central1",
        zone=ZONE,
        instance_type=instance_type,
        market="spot",
        gpu=gpu,
        gpu_count=count,
        tags={"broker-job": "Job_42", "broker-attempt": token, "broker-team": "Vision Team"},
        # Nothing listens there: the instance's agent fetch fails, which these tests ignore.
        boot_script=boot_script("http://127.0.0.1:9", token, "att_1.secret", "gcp"),
    )


def test_n1_launch_attaches_guest_accelerators_labels_and_the_boot_script(
    gcp: GcpProvider, local_cloud: LocalCloud
) -> None:
    request = _request()
    ref = gcp.launch(request)
    instance = gce_client(local_cloud).get(project=gcp.project, zone=ZONE, instance=ref.instance_id)
    assert instance.guest_accelerators[0].accelerator_type.endswith("nvidia-tesla-v100")
    assert instance.guest_accelerators[0].accelerator_count == 2
    assert instance.scheduling.provisioning_model == "SPOT"
    assert instance.scheduling.instance_termination_action == "DELETE"
    assert instance.labels["broker-team"] == "vision-team"
    assert instance.labels["broker-job"] == "job_42"
    metadata = {item.key: item.value for item in instance.metadata.items}
    assert metadata == {"startup-script": request.boot_script, "install-nvidia-driver": "True"}
    assert list(instance.service_accounts) == []  # none configured
    source = instance.disks[0].initialize_params.source_image
    assert source == (
        "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
    )
    assert instance.network_interfaces[0].access_configs[0].type_ == "ONE_TO_ONE_NAT"
    gcp.terminate(ref)


def test_instances_run_as_the_configured_service_account_with_storage_access(
    local_cloud: LocalCloud,
) -> None:
    local_cloud.market.set_available("gcp", ZONE, "*", True)
    account = "broker-instances@broker-local.iam.gserviceaccount.com"
    gcp = GcpProvider.from_settings(
        local_cloud.settings().model_copy(
            update={"gcp_service_account": account, "gcp_image_families": {"x86_64": "my-fam"}}
        ),
        retry=FAST_RETRY,
    )
    ref = gcp.launch(_request("g2-standard-4", "L4", 1))
    instance = gce_client(local_cloud).get(project=gcp.project, zone=ZONE, instance=ref.instance_id)
    assert [(a.email, list(a.scopes)) for a in instance.service_accounts] == [
        (account, [STORAGE_SCOPE])
    ]
    assert instance.disks[0].initialize_params.source_image.endswith("/family/my-fam")
    gcp.terminate(ref)


def test_the_image_family_follows_the_machines_architecture(gcp: GcpProvider) -> None:
    assert architecture("a4x-highgpu-4g") == "arm64"
    assert architecture("a3-highgpu-8g") == architecture("n1-standard-8") == "x86_64"
    with pytest.raises(ProviderError, match="BROKER_GCP_IMAGE_FAMILIES"):
        gcp.image("arm64")
    gcp.image_families["arm64"] = "an-arm64-family"
    request = _request("a4x-highgpu-4g", "B200", 4)
    resource = instance_resource(
        name="n", request=request, labels={}, termination_action="DELETE", image=gcp.image("arm64")
    )
    assert resource.disks[0].initialize_params.source_image == (
        "projects/deeplearning-platform-release/global/images/family/an-arm64-family"
    )


def test_accelerator_optimized_types_need_no_guest_accelerators(
    gcp: GcpProvider, local_cloud: LocalCloud
) -> None:
    ref = gcp.launch(_request("a2-highgpu-1g", "A100", 1))
    instance = gce_client(local_cloud).get(project=gcp.project, zone=ZONE, instance=ref.instance_id)
    assert list(instance.guest_accelerators) == []
    gcp.terminate(ref)


def test_stop_on_preemption_leaves_a_terminated_instance_seen_as_preempted(
    local_cloud: LocalCloud, market_clock: ManualClock
) -> None:
    local_cloud.market.set_available("gcp", ZONE, "*", True)
    gcp = GcpProvider.from_settings(
        local_cloud.settings(), retry=FAST_RETRY, termination_action="STOP"
    )
    ref = gcp.launch(_request("g2-standard-4", "L4", 1))
    local_cloud.market.set_available("gcp", ZONE, "*", False)
    assert local_cloud.market.step() == 0  # the notice
    assert gcp.describe(ref).status == "running"
    market_clock.advance(NOTICE_SECONDS["gcp"])
    assert local_cloud.market.step() >= 1
    state = gcp.describe(ref)
    assert state.status == "preempted"
    assert ref in gcp.list_managed("us-central1")  # a stopped instance still costs its disk
    gcp.terminate(ref)
    assert ref not in gcp.list_managed("us-central1")
    assert gcp.describe(ref).status == "preempted"


def test_fake_deduplicates_request_ids_and_rejects_live_migration_with_gpus(
    local_cloud: LocalCloud,
) -> None:
    client = gce_client(local_cloud)
    project = local_cloud.gcp_project
    name = f"raw-{uuid.uuid4().hex[:8]}"
    instance = compute_v1.Instance(
        name=name, machine_type=f"zones/{ZONE}/machineTypes/n1-standard-1"
    )
    request = compute_v1.InsertInstanceRequest(
        project=project, zone=ZONE, instance_resource=instance, request_id=str(uuid.uuid4())
    )
    first = client.insert_unary(request=request)
    assert client.insert_unary(request=request).name == first.name
    with pytest.raises(gexc.Conflict):
        client.insert_unary(project=project, zone=ZONE, instance_resource=instance)
    gpu = compute_v1.Instance(
        name=f"raw-{uuid.uuid4().hex[:8]}",
        machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
        guest_accelerators=[
            compute_v1.AcceleratorConfig(accelerator_type="nvidia-tesla-t4", accelerator_count=1)
        ],
        scheduling=compute_v1.Scheduling(on_host_maintenance="MIGRATE"),
    )
    with pytest.raises(gexc.BadRequest, match="live migration"):
        client.insert_unary(project=project, zone=ZONE, instance_resource=gpu)
    client.delete_unary(project=project, zone=ZONE, instance=name)


def test_fake_serves_zones_machine_types_and_accelerator_types(local_cloud: LocalCloud) -> None:
    options = {"credentials": AnonymousCredentials(), "transport": "rest"}
    endpoint = {"api_endpoint": local_cloud.gcp_endpoint_url}
    project = local_cloud.gcp_project
    zones = compute_v1.ZonesClient(client_options=endpoint, **options)
    listed = [z.name for z in zones.list(project=project)]  # its own, then the catalog's
    assert listed[: len(local_cloud.gcp_zones)] == local_cloud.gcp_zones
    assert "europe-west4-a" in listed
    machine_types = compute_v1.MachineTypesClient(client_options=endpoint, **options)
    a2 = machine_types.get(project=project, zone=ZONE, machine_type="a2-highgpu-1g")
    assert a2.accelerators[0].guest_accelerator_type == "nvidia-tesla-a100"
    accelerators = compute_v1.AcceleratorTypesClient(client_options=endpoint, **options)
    names = {a.name for a in accelerators.list(project=project, zone=ZONE)}
    assert {"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"} <= names
    with pytest.raises(gexc.NotFound):
        zones.get(project=project, zone="mars-north1-a")
