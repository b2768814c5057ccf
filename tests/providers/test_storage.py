"""The S3 checkpoint store against the moto server."""

from __future__ import annotations

import urllib.request
import uuid

import pytest

from providers.base import ObjectNotFound
from providers.local import Fault, LocalCloud
from providers.retry import FAST_RETRY
from providers.storage import S3CheckpointStore


@pytest.fixture
def store(local_cloud: LocalCloud) -> S3CheckpointStore:
    return S3CheckpointStore.from_settings(local_cloud.settings(), retry=FAST_RETRY)


def test_latest_key_is_the_newest_checkpoint_of_the_job(store: S3CheckpointStore) -> None:
    prefix = f"jobs/{uuid.uuid4()}/"
    assert store.latest_key(prefix) is None
    for step in (10, 20, 30):
        store.put(f"{prefix}ckpt-{step:08d}", f"state {step}".encode())
    store.put(f"jobs/{uuid.uuid4()}/ckpt-99999999", b"another job")
    assert store.latest_key(prefix) == f"{prefix}ckpt-00000030"
    assert store.list_keys(prefix) == [f"{prefix}ckpt-{s:08d}" for s in (10, 20, 30)]
    assert store.get(f"{prefix}ckpt-00000020") == b"state 20"


def test_missing_checkpoint_is_object_not_found(store: S3CheckpointStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("jobs/nobody/ckpt-1")


def test_throttled_store_calls_are_retried(
    store: S3CheckpointStore, local_cloud: LocalCloud
) -> None:
    key = f"jobs/{uuid.uuid4()}/ckpt-1"
    local_cloud.faults.fail_next(2, Fault.THROTTLE)
    store.put(key, b"x")
    local_cloud.faults.fail_next(2, Fault.SERVER_ERROR)
    assert store.get(key) == b"x"
    assert local_cloud.faults.total_injected == 4


def test_presigned_urls_get_and_put_without_credentials(store: S3CheckpointStore) -> None:
    key = f"jobs/{uuid.uuid4()}/checkpoints/att_1/1.2e+06-1.tar.gz"
    put = store.presigned_put(key, 60)
    assert "X-Amz-Signature=" in put and "X-Amz-Expires=60" in put
    upload = urllib.request.Request(
        put, data=b"state", method="PUT", headers={"Content-Type": "application/gzip"}
    )
    with urllib.request.urlopen(upload) as reply:
        assert reply.status == 200
    assert store.get(key) == b"state"
    with urllib.request.urlopen(store.presigned_get(key, 60)) as reply:
        assert reply.read() == b"state"
