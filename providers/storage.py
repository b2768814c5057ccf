"""The checkpoint store: objects in an S3 bucket (AWS or the moto server), through boto3."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from broker.settings import Settings
from providers.aws_errors import call_aws, error_code
from providers.retry import RetryPolicy

T = TypeVar("T")


class S3CheckpointStore:
    """Put, get and find the latest checkpoint object under a job's key prefix.

    "Latest" is the newest ``LastModified``, ties broken by key, so keys that sort by
    progress (e.g. zero-padded steps) stay correct within one second.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket = bucket
        self.region = region
        session = boto3.session.Session(
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key
        )
        config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": "path"},
            signature_version="s3v4",  # presigned URLs: SigV4, accepted in every region
        )
        self._s3 = session.client(
            "s3", region_name=region, endpoint_url=endpoint_url, config=config
        )
        self._retry = retry or RetryPolicy()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> S3CheckpointStore:
        """Build from ``BROKER_CHECKPOINT_BUCKET`` and the ``BROKER_AWS_*`` settings."""
        secret = settings.aws_secret_access_key
        options: dict[str, Any] = {
            "endpoint_url": settings.aws_endpoint_url,
            "region": settings.aws_region,
            "access_key_id": settings.aws_access_key_id,
            "secret_access_key": secret.get_secret_value() if secret else None,
        }
        options.update(overrides)
        return cls(settings.checkpoint_bucket, **options)

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet."""

        def create() -> None:
            options: dict[str, Any] = {"Bucket": self.bucket}
            if self.region != "us-east-1":
                options["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            try:
                self._s3.create_bucket(**options)
            except ClientError as exc:
                if error_code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._call("CreateBucket", create)

    def put(self, key: str, body: bytes) -> None:
        """Store one checkpoint object."""
        self._call("PutObject", lambda: self._s3.put_object(Bucket=self.bucket, Key=key, Body=body))

    def get(self, key: str) -> bytes:
        """Read one checkpoint object; ``ObjectNotFound`` if there is none."""
        reply = self._call("GetObject", lambda: self._s3.get_object(Bucket=self.bucket, Key=key))
        return bytes(reply["Body"].read())

    def presigned_get(self, key: str, seconds: float) -> str:
        """A URL that downloads ``key`` with a plain GET for ``seconds`` (wall clock), no
        credentials needed (an instance restoring a checkpoint or fetching its workdir)."""
        return self._presigned("get_object", key, seconds)

    def presigned_put(self, key: str, seconds: float) -> str:
        """A URL that stores one object at ``key`` with a plain PUT for ``seconds`` (wall
        clock): how an instance uploads a checkpoint without credentials of its own."""
        return self._presigned("put_object", key, seconds)

    def _presigned(self, method: str, key: str, seconds: float) -> str:
        # Signing is local (no call to S3), so there is nothing to retry.
        return str(
            self._s3.generate_presigned_url(
                method,
                Params={"Bucket": self.bucket, "Key": key},
                ExpiresIn=max(1, int(seconds)),
                HttpMethod="GET" if method == "get_object" else "PUT",
            )
        )

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, oldest first."""
        return [item["Key"] for item in self._objects(prefix)]

    def latest_key(self, prefix: str) -> str | None:
        """The newest checkpoint key under ``prefix``, or None if there is none."""
        objects = self._objects(prefix)
        return objects[-1]["Key"] if objects else None

    def _objects(self, prefix: str) -> list[dict[str, Any]]:
        def fetch() -> list[dict[str, Any]]:
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            return [item for page in pages for item in page.get("Contents", [])]

        objects = self._call("ListObjectsV2", fetch)
        return sorted(objects, key=lambda item: (item["LastModified"], item["Key"]))

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        return call_aws(self._retry, action, fn)
