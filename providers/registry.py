"""Build the broker's providers and checkpoint store from settings."""

from __future__ import annotations

from typing import Any

from broker.settings import Settings
from providers.aws import AwsProvider
from providers.base import Provider
from providers.gcp import GcpProvider
from providers.storage import S3CheckpointStore


def build_providers(settings: Settings, **options: Any) -> dict[str, Provider]:
    """One provider per cloud, keyed by name (``aws``, ``gcp``); options go to every one."""
    return {
        "aws": AwsProvider.from_settings(settings, **options),
        "gcp": GcpProvider.from_settings(settings, **options),
    }


def build_checkpoint_store(settings: Settings, **options: Any) -> S3CheckpointStore:
    """The checkpoint store of ``settings.checkpoint_bucket``."""
    return S3CheckpointStore.from_settings(settings, **options)
