"""Partial responses: the projector of the ``fields`` syntax, the GCE fake honouring it, and
``GcpProvider``'s aggregated listings asking for only what they read."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from broker.clock import ManualClock
from providers.base import (
    REASON_SPOT_PREEMPTED,
    InstanceRef,
    InstanceState,
    LaunchRequest,
    Market,
)
from providers.gcp import AGGREGATED_FIELDS, STATUS_FIELDS, GcpProvider
from providers.local import LocalCloud
from providers.local.instances import NOTICE_SECONDS
from providers.local.partial_response import ALL, parse_fields, project
from providers.retry import FAST_RETRY
from tests.providers.conftest import gce_client

ZONE = "us-central1-b"

DOCUMENT: dict[str, Any] = {
    "kind": "compute#instanceAggregatedList",
    "nextPageToken": "t1",
    "items": {
        "zones/a": {
            "instances": [
                {
                    "name": "i1",
                    "status": "RUNNING",
                    "labels": {"team": "vision"},
                    "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False},
                    "disks": [{"boot": True, "deviceName": "d1"}, {"boot": False}],
                    "tags": {"items": ["x", "y"]},
                },
                {"name": "i2", "status": "TERMINATED", "scheduling": {}},
            ]
        },
        "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}},
    },
}


def test_no_selection_is_the_whole_document() -> None:
    assert project(DOCUMENT, None) is DOCUMENT
    assert project(DOCUMENT, "") is DOCUMENT
    assert project(DOCUMENT, "*") == DOCUMENT


def test_commas_select_several_fields_and_slashes_reach_inside() -> None:
    assert project(DOCUMENT, "kind,nextPageToken") == {
        "kind": "compute#instanceAggregatedList",
        "nextPageToken": "t1",
    }
    assert project(DOCUMENT, "items/zones") == {}  # no such key: nothing
    assert project({"a": {"b": {"c": 1, "d": 2}}}, "a/b/c") == {"a": {"b": {"c": 1}}}
    assert project({"a": {"b": {"c": 1, "d": 2}}}, "a.b.d") == {"a": {"b": {"d": 2}}}


def test_the_wildcard_walks_map_keys_and_lists_apply_the_selection_to_each_element() -> None:
    fields = "nextPageToken,items/*/instances(name,scheduling/provisioningModel,disks(boot))"
    assert project(DOCUMENT, fields) == {
        "nextPageToken": "t1",
        "items": {
            "zones/a": {
                "instances": [
                    {
                        "name": "i1",
                        "scheduling": {"provisioningModel": "SPOT"},
                        "disks": [{"boot": True}, {"boot": False}],
                    },
                    {"name": "i2"},  # scheduling had nothing selected: dropped
                ]
            }
        },  # zones/b has no instances: dropped
    }
    assert project(DOCUMENT, "items/*/warning/code") == {
        "items": {"zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}
    }
    whole_lists = project(DOCUMENT, "items/*/instances/tags")
    assert whole_lists == {"items": {"zones/a": {"instances": [{"tags": {"items": ["x", "y"]}}]}}}


def test_unknown_names_select_nothing_and_overlaps_merge() -> None:
    assert project(DOCUMENT, "nope,items/*/instances(nope)") == {}
    assert project(DOCUMENT, "items/*/instances/name/deeper") == {}  # a scalar has no fields
    merged = project(DOCUMENT, "items/*/instances/scheduling,items/*/instances(scheduling/x)")
    assert merged["items"]["zones/a"]["instances"][0]["scheduling"] == {
        "provisioningModel": "SPOT",
        "automaticRestart": False,
    }
    assert parse_fields(" a ( b , c/d ) , a/c/e ") == {"a": {"b": ALL, "c": {"d": ALL, "e": ALL}}}
    assert parse_fields("a/b,a") == {"a": ALL}


@pytest.mark.parametrize("bad", ["a(b", "a,,b", "a/", "(a)", "a)b", "a(b)c"])
def test_malformed_selections_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid field selection"):
        parse_fields(bad)


@pytest.fixture
def gcp(local_cloud: LocalCloud) -> GcpProvider:
    local_cloud.market.set_available("gcp", ZONE, "*", True)
    return GcpProvider.from_settings(
        local_cloud.settings(), retry=FAST_RETRY, termination_action="STOP"
    )


def _launch(gcp: GcpProvider, market: Market = "spot") -> InstanceRef:
    token = f"Attempt-{uuid.uuid4()}"
    return gcp.launch(
        LaunchRequest(
            token=token,
            provider="gcp",
            region="us-central1",
            zone=ZONE,
            instance_type="g2-standard-4",
            market=market,
            gpu="L4",
            gpu_count=1,
            tags={"broker-job": "job_7", "broker-attempt": token, "broker-team": "Vision"},
            boot_script="#!/bin/bash\ntrue\n",
        )
    )


def test_the_fake_answers_a_masked_aggregated_list_with_only_the_selected_fields(
    gcp: GcpProvider, local_cloud: LocalCloud
) -> None:
    ref = _launch(gcp)
    url = f"{local_cloud.gcp_endpoint_url}/compute/v1/projects/{gcp.project}/aggregated/instances"
    query = {"filter": f'name eq "{ref.instance_id}"'}
    full = requests.get(url, params=query, timeout=10).json()
    listed = full["items"][f"zones/{ZONE}"]["instances"][0]
    assert {"disks", "networkInterfaces", "metadata", "selfLink"} <= set(listed)
    for masked in (
        requests.get(
            url, params=query, headers={"X-Goog-FieldMask": AGGREGATED_FIELDS}, timeout=10
        ),
        requests.get(url, params={**query, "fields": AGGREGATED_FIELDS}, timeout=10),
    ):
        body = masked.json()
        assert set(body) == {"items"}  # no kind, no id; no page token to give
        assert list(body["items"]) == [f"zones/{ZONE}"]  # the other zones had nothing
        (instance,) = body["items"][f"zones/{ZONE}"]["instances"]
        assert instance == {
            "name": ref.instance_id,
            "status": "RUNNING",
            "labels": listed["labels"],
            "creationTimestamp": listed["creationTimestamp"],
            "scheduling": {"provisioningModel": "SPOT"},
        }
    bad = requests.get(url, params={"fields": "items("}, timeout=10)
    assert bad.status_code == 400
    assert bad.json()["error"]["errors"][0]["reason"] == "invalidParameter"
    gcp.terminate(ref)


def test_the_client_parses_the_partial_instances_and_the_provider_asks_for_them(
    gcp: GcpProvider, local_cloud: LocalCloud
) -> None:
    ref = _launch(gcp)
    client = gce_client(local_cloud)
    pages = client.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(
            project=gcp.project, filter=f'name eq "{ref.instance_id}"'
        ),
        metadata=[("x-goog-fieldmask", "items/*/instances(name,disks/boot)")],
    )
    (instance,) = [i for _, scoped in pages for i in scoped.instances]
    assert instance.name == ref.instance_id
    assert [d.boot for d in instance.disks] == [True]
    assert not instance.disks[0].device_name and not instance.status
    # The provider's own listing: what listed_state reads, none of the rest.
    ((zone, listed),) = gcp._aggregated(f'name eq "{ref.instance_id}"')
    assert zone == ZONE and listed.status == "RUNNING" and listed.labels["broker-job"] == "job_7"
    assert listed.scheduling.provisioning_model == "SPOT"
    assert list(listed.disks) == [] and list(listed.network_interfaces) == []
    assert not listed.metadata.items and not listed.machine_type and not listed.self_link
    gcp.terminate(ref)
    with pytest.raises(gexc.BadRequest):
        list(client.aggregated_list(project=gcp.project, metadata=[("x-goog-fieldmask", "a(")]))


def test_describe_many_on_partial_resources_says_what_describe_says(
    gcp: GcpProvider, local_cloud: LocalCloud, market_clock: ManualClock
) -> None:
    """Up instances come back from a status-only listing (no labels, launch time or market,
    as EC2's DescribeInstanceStatus); an ended one is listed again in full, and then says
    what ``describe`` says."""
    spot, on_demand = _launch(gcp), _launch(gcp, "on_demand")
    masks: list[str | None] = []  # each aggregatedList's field mask, as the client sent it

    def sent(response: requests.Response, **_: Any) -> None:
        if "/aggregated/instances" in response.request.url:
            masks.append(response.request.headers.get("x-goog-fieldmask"))

    gcp._instances._transport._session.hooks["response"].append(sent)
    states = gcp.describe_many([spot, on_demand])
    assert masks == [STATUS_FIELDS]
    for ref in (spot, on_demand):
        full = gcp.describe(ref)
        assert full.status == "running" and full.launched_at is not None
        assert states[ref] == InstanceState("running", None, None)
    assert gcp.describe(spot).market == "spot" and gcp.describe(on_demand).market == "on_demand"

    # Preempted with termination action STOP: still listed, TERMINATED, lastStopTimestamp set.
    local_cloud.market.set_available("gcp", ZONE, "*", False)
    local_cloud.market.step()  # the notice
    market_clock.advance(NOTICE_SECONDS["gcp"])
    assert local_cloud.market.step() >= 1
    masks.clear()
    states = gcp.describe_many([spot, on_demand])
    assert masks == [STATUS_FIELDS, AGGREGATED_FIELDS]  # the ended one again, in full
    preempted = states[spot]
    assert preempted == gcp.describe(spot)
    assert preempted is not None and preempted.status == "preempted"
    assert preempted.reason == REASON_SPOT_PREEMPTED and preempted.market == "spot"
    assert preempted.terminated_at is not None and preempted.tags["broker-job"] == "job_7"
    assert states[on_demand] is not None and states[on_demand].status == "running"  # type: ignore[union-attr]
    managed = {m: m.state for m in gcp.list_managed("us-central1") if m in (spot, on_demand)}
    assert managed[spot].status == "terminated" and managed[spot].reason == "terminated"
    assert managed[on_demand].status == "running"
    assert managed[on_demand].tags["broker-job"] == "job_7"
    for ref in (spot, on_demand):
        gcp.terminate(ref)
