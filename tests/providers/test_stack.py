"""LocalCloud: endpoints, environment, background market replay, clean stop."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import httpx
import pytest

from broker.clock import ScaledClock
from providers.base import LaunchRequest
from providers.gcp import GcpProvider
from providers.local import LocalCloud
from providers.registry import build_providers
from providers.retry import FAST_RETRY


def test_env_points_the_broker_at_both_local_clouds(local_cloud: LocalCloud) -> None:
    env = local_cloud.env
    assert env["BROKER_AWS_ENDPOINT_URL"] == local_cloud.aws_endpoint_url
    assert env["BROKER_GCP_ENDPOINT_URL"] == local_cloud.gcp_endpoint_url
    assert env["BROKER_AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    providers = build_providers(local_cloud.settings(), retry=FAST_RETRY)
    assert set(providers) == {"aws", "gcp"}


def test_background_replay_preempts_and_stop_releases_the_ports() -> None:
    zones = ["europe-west4-a"]
    fast = ScaledClock(600.0, datetime.now(UTC))  # the 30 s notice passes in 0.05 s
    with LocalCloud(
        aws_regions=["us-east-1"], gcp_zones=zones, market_interval_seconds=0.05, clock=fast
    ) as cloud:
        gcp = GcpProvider.from_settings(cloud.settings(), retry=FAST_RETRY)
        cloud.market.set_available("gcp", zones[0], "*", True)
        token = str(uuid.uuid4())
        ref = gcp.launch(
            LaunchRequest(
                token=token,
                provider="gcp",
                region="europe-west4",
                zone=zones[0],
                instance_type="g2-standard-4",
                market="spot",
                gpu="L4",
                tags={"broker-job": "j"},
            )
        )
        cloud.market.set_available("gcp", zones[0], "*", False)
        deadline = time.monotonic() + 5
        while gcp.describe(ref).status != "preempted" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gcp.describe(ref).status == "preempted"
        endpoints = [cloud.aws_endpoint_url, cloud.gcp_endpoint_url, cloud.instances.metadata_url]
    for url in endpoints:
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=1)
