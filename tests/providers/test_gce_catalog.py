"""What the GCE fake offers per zone (from the bundled catalog), aggregated listings and the
test switches, through google-cloud-compute."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from pricing.gcp_catalog import read_gcp_rows
from providers.local import LocalCloud


@pytest.fixture
def cloud(local_cloud: LocalCloud) -> Iterator[LocalCloud]:
    yield local_cloud
    local_cloud.gce.catalog.reset()


def clients(cloud: LocalCloud) -> dict[str, Any]:
    options = {
        "credentials": AnonymousCredentials(),
        "transport": "rest",
        "client_options": {"api_endpoint": cloud.gcp_endpoint_url},
    }
    return {
        "zones": compute_v1.ZonesClient(**options),
        "machines": compute_v1.MachineTypesClient(**options),
        "accelerators": compute_v1.AcceleratorTypesClient(**options),
    }


def test_every_catalog_zone_is_listed_with_the_machine_and_gpu_types_it_has(
    cloud: LocalCloud,
) -> None:
    api = clients(cloud)
    project = cloud.gcp_project
    hosts, accelerators = read_gcp_rows()
    listed = {z.name for z in api["zones"].list(project=project)}
    assert {zone for _, zone in hosts} <= listed
    machines = {m.name for m in api["machines"].list(project=project, zone="us-east1-b")}
    assert "a2-highgpu-1g" in machines and "n1-standard-8" in machines
    assert "a3-megagpu-8g" not in machines  # the catalog has no A3 Mega in us-east1-b
    mega = api["machines"].get(project=project, zone="us-central1-a", machine_type="a3-megagpu-8g")
    assert mega.accelerators[0].guest_accelerator_type == "nvidia-h100-mega-80gb"
    sixteen = api["machines"].get(
        project=project, zone="us-central1-a", machine_type="a2-megagpu-16g"
    )
    assert (sixteen.guest_cpus, sixteen.accelerators[0].guest_accelerator_count) == (96, 16)
    gpus = {a.name for a in api["accelerators"].list(project=project, zone="us-east1-b")}
    assert gpus == {"nvidia-tesla-a100", "nvidia-l4", "nvidia-tesla-p100"}


def test_aggregated_lists_honour_the_name_filter(cloud: LocalCloud) -> None:
    api = clients(cloud)
    found = {
        (scope.rsplit("/", 1)[-1], m.name)
        for scope, scoped in api["machines"].aggregated_list(
            request={
                "project": cloud.gcp_project,
                "filter": 'name eq "(g2-standard-4|n1-standard-8)"',
            }
        )
        for m in scoped.machine_types
    }
    assert {name for _, name in found} == {"g2-standard-4", "n1-standard-8"}
    assert ("europe-west4-a", "g2-standard-4") in found
    cards = {
        (scope.rsplit("/", 1)[-1], a.name): a.maximum_cards_per_instance
        for scope, scoped in api["accelerators"].aggregated_list(project=cloud.gcp_project)
        for a in scoped.accelerator_types
    }
    assert cards["us-central1-a", "nvidia-tesla-t4"] == 4


def test_a_zone_taken_down_and_a_withdrawn_type_show_in_the_listings(cloud: LocalCloud) -> None:
    api = clients(cloud)
    project = cloud.gcp_project
    cloud.gce.catalog.set_up("us-east1-b", False)
    cloud.gce.catalog.withdraw("us-central1-a", "nvidia-tesla-t4")
    status = {z.name: z.status for z in api["zones"].list(project=project)}
    assert status["us-east1-b"] == "DOWN" and status["us-central1-a"] == "UP"
    gpus = {a.name for a in api["accelerators"].list(project=project, zone="us-central1-a")}
    assert "nvidia-tesla-t4" not in gpus and "nvidia-tesla-v100" in gpus
