"""``LocalCloud``: moto server (with the AWS pricing APIs), GCE fake, Cloud Billing fake, market
replay and the instances' processes (with their metadata server), started and stopped
together."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from broker.clock import Clock
from broker.settings import Settings
from providers.local.aws import LocalAws, zone_names
from providers.local.billing_fake import BillingFake
from providers.local.faults import FaultInjector
from providers.local.gce_fake import GceFake
from providers.local.instances import NOTICE_SECONDS, LocalInstances, Runner
from providers.local.market import MarketReplay
from providers.retry import FAST_RETRY
from providers.storage import S3CheckpointStore

logger = logging.getLogger(__name__)

LOCAL_ACCESS_KEY = "testing"
LOCAL_SECRET_KEY = "testing"
# Images moto serves in every region; the local instances run on the host whatever the image.
LOCAL_IMAGE_IDS = {"x86_64": "ami-760aaa0f", "arm64": "ami-0e9271c829888680e"}


class LocalCloud:
    """Both local clouds sharing one market replay and one fault injector; their pricing
    APIs (AWS Price List and spot price history, the Cloud Billing fake) serve the bundled
    prices as ``market.set_price`` / ``stage_price`` move them.

    Use as a context manager; ``env`` holds the ``BROKER_*`` variables that point the
    broker's providers at it, ``settings()`` the same as a ``Settings`` copy. ``instances``
    runs what the clouds launch: each boot script as a process in a folder under
    ``instances_dir`` (default: a temporary folder removed on stop), or with
    ``instance_runner="light"`` as an in-process play of the agent (benches). A spot
    instance gets its notice ``spot_notice_seconds[provider]`` broker seconds before the
    reclaim (default: AWS 120, GCP 30).
    """

    def __init__(
        self,
        *,
        aws_regions: Sequence[str] = ("us-east-1", "us-east-2", "us-west-2"),
        gcp_zones: Sequence[str] = ("us-central1-a", "us-central1-b", "us-east1-b"),
        gcp_project: str = "broker-local",
        checkpoint_bucket: str = "broker-checkpoints",
        fault_rate: float = 0.0,
        fault_seed: int = 0,
        market: MarketReplay | None = None,
        market_offset_seconds: float = 0.0,
        market_interval_seconds: float | None = 1.0,
        clock: Clock | None = None,
        host: str = "127.0.0.1",
        instances_dir: Path | None = None,
        instance_runner: Runner = "process",
        spot_notice_seconds: Mapping[str, float] | None = None,
    ) -> None:
        self.aws_regions = list(aws_regions)
        self.gcp_zones = list(gcp_zones)
        self.gcp_project = gcp_project
        self.checkpoint_bucket = checkpoint_bucket
        self.fault_rate = fault_rate
        self.faults = FaultInjector(0.0, seed=fault_seed)
        self.market = market or MarketReplay.default(
            aws_zones=zone_names(self.aws_regions),
            gcp_zones=self.gcp_zones,
            offset_seconds=market_offset_seconds,
            clock=clock,
        )
        self.market_interval_seconds = market_interval_seconds
        self.instances = LocalInstances(
            instances_dir, runner=instance_runner, host=host, clock=clock
        )
        notice = {**NOTICE_SECONDS, **(spot_notice_seconds or {})}
        self.aws = LocalAws(
            host=host,
            market=self.market,
            faults=self.faults,
            instances=self.instances,
            spot_notice_seconds=notice["aws"],
        )
        self.gce = GceFake(
            self.gcp_zones,
            host=host,
            market=self.market,
            faults=self.faults,
            clock=clock,
            instances=self.instances,
            spot_notice_seconds=notice["gcp"],
        )
        self.billing = BillingFake(host=host, market=self.market, faults=self.faults)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LocalCloud:
        """Regions, zones, project, bucket and fault rate from settings; overrides win."""
        options: dict[str, Any] = {
            "aws_regions": settings.aws_regions,
            "gcp_zones": settings.gcp_zones,
            "gcp_project": settings.gcp_project,
            "checkpoint_bucket": settings.checkpoint_bucket,
            "fault_rate": settings.local_fault_rate,
        }
        options.update(overrides)
        return cls(**options)

    @property
    def aws_endpoint_url(self) -> str:
        """Where the moto server listens."""
        return self.aws.endpoint_url

    @property
    def gcp_endpoint_url(self) -> str:
        """Where the GCE fake listens."""
        return self.gce.endpoint_url

    @property
    def gcp_billing_endpoint_url(self) -> str:
        """Where the Cloud Billing Catalog fake listens."""
        return self.billing.endpoint_url

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point a broker process at these clouds."""
        return {
            "BROKER_AWS_ENDPOINT_URL": self.aws_endpoint_url,
            "BROKER_AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "BROKER_AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "BROKER_GCP_ENDPOINT_URL": self.gcp_endpoint_url,
            "BROKER_GCP_BILLING_ENDPOINT_URL": self.gcp_billing_endpoint_url,
            "BROKER_GCP_PROJECT": self.gcp_project,
            "BROKER_CHECKPOINT_BUCKET": self.checkpoint_bucket,
            "BROKER_AWS_IMAGE_IDS": json.dumps(LOCAL_IMAGE_IDS),
        }

    def settings(self, base: Settings | None = None) -> Settings:
        """``base`` (default: fresh ``Settings()``) with the endpoints of these clouds."""
        return (base or Settings()).model_copy(
            update={
                "aws_endpoint_url": self.aws_endpoint_url,
                "aws_access_key_id": LOCAL_ACCESS_KEY,
                "aws_secret_access_key": SecretStr(LOCAL_SECRET_KEY),
                "aws_regions": self.aws_regions,
                "gcp_endpoint_url": self.gcp_endpoint_url,
                "gcp_billing_endpoint_url": self.gcp_billing_endpoint_url,
                "gcp_project": self.gcp_project,
                "gcp_zones": self.gcp_zones,
                "checkpoint_bucket": self.checkpoint_bucket,
                "aws_image_ids": dict(LOCAL_IMAGE_IDS),
            }
        )

    def start(self) -> LocalCloud:
        """Start the instances' metadata server, both clouds, the checkpoint bucket, the market."""
        self.instances.serve()
        try:
            self.aws.start()
            self.gce.start()
            self.billing.start()
            S3CheckpointStore(
                self.checkpoint_bucket,
                endpoint_url=self.aws_endpoint_url,
                region=self.aws_regions[0] if self.aws_regions else "us-east-1",
                access_key_id=LOCAL_ACCESS_KEY,
                secret_access_key=LOCAL_SECRET_KEY,
                retry=FAST_RETRY,
            ).ensure_bucket()
        except BaseException:
            self.stop()
            raise
        self.faults.rate = self.fault_rate  # after setup, so setup itself never fails
        if self.market_interval_seconds:
            self.market.start(self.market_interval_seconds)
        logger.info("local cloud up", extra=self.env)
        return self

    def stop(self) -> None:
        """Stop the market thread, kill every instance, stop the servers."""
        self.market.stop()
        self.instances.close()
        self.billing.stop()
        self.gce.stop()
        self.aws.stop()

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
