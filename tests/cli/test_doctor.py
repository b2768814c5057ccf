"""``broker doctor`` against the local clouds: all well, then broken on purpose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from broker.db.engine import make_engine
from broker.db.migrate import upgrade
from broker.services.doctor import Check, run_checks
from broker.settings import Settings, get_settings
from providers.aws_setup import IMAGE_NAMES
from providers.local import LocalCloud
from tests.cli.support import failed, ok, runner

PROFILE = "broker-doctor-instances"


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    """Local clouds with a Deep Learning AMI per architecture and an instance profile."""
    with LocalCloud(
        aws_regions=["us-east-1"], gcp_zones=["us-central1-a"], market_interval_seconds=None
    ) as local:
        options = {
            "region_name": "us-east-1",
            "endpoint_url": local.aws_endpoint_url,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        ec2 = boto3.client("ec2", **options)
        for arch, pattern in IMAGE_NAMES.items():
            ec2.register_image(Name=pattern.replace("*", "20250102"), Architecture=arch)
        iam = boto3.client("iam", **options)
        profiles = iam.list_instance_profiles()["InstanceProfiles"]  # moto's state is global
        if PROFILE not in {p["InstanceProfileName"] for p in profiles}:
            iam.create_instance_profile(InstanceProfileName=PROFILE)
        yield local


@pytest.fixture
def env(cloud: LocalCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``BROKER_*`` for a broker on the local clouds with a migrated database; tests change
    it and call ``doctor()``."""
    database = f"sqlite:///{tmp_path / 'broker.db'}"
    upgrade(make_engine(database))
    values = {
        **cloud.env,
        "BROKER_DATA_DIR": str(tmp_path),
        "BROKER_DATABASE_URL": database,
        "BROKER_CELERY_BROKER_URL": "filesystem://",
        "BROKER_AWS_REGIONS": json.dumps(cloud.aws_regions),
        "BROKER_GCP_ZONES": json.dumps(cloud.gcp_zones),
        "BROKER_AWS_IMAGE_OWNERS": '["self"]',  # the registered images are the account's
        "BROKER_AWS_IMAGE_IDS": "{}",  # looked up by name, not the local cloud's fixed ids
        "BROKER_AWS_INSTANCE_PROFILE": PROFILE,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield values
    get_settings.cache_clear()


def doctor(*args: str) -> Any:
    from broker.cli import app

    get_settings.cache_clear()
    return runner.invoke(app, ["doctor", "--timeout", "2", *args])


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_everything_passes_on_the_local_clouds(env: dict[str, str]) -> None:
    checks = _by_name(run_checks(Settings(), timeout=2))
    assert {name for name, c in checks.items() if c.status != "ok"} == {
        "GCP service account",
        "GCP images",
    }  # skipped: the GCE fake needs neither
    assert checks["database schema"].detail.endswith("(newest)")
    assert checks["AWS credentials"].detail.startswith("arn:aws:")
    arm64, x86_64 = checks["AWS image us-east-1 arm64"], checks["AWS image us-east-1 x86_64"]
    assert arm64.detail.startswith("ami-") and "for g5g." in arm64.detail
    assert x86_64.detail.startswith("ami-") and "g5g" not in x86_64.detail
    assert arm64.detail.split()[0] != x86_64.detail.split()[0]
    assert checks["AWS instance profile"].detail.endswith(f"instance-profile/{PROFILE}")
    assert "put and delete work" in checks["checkpoint bucket"].detail
    assert "on demand" in checks["AWS pricing APIs"].detail
    assert "Compute Engine SKUs answer" in checks["GCP Cloud Billing"].detail
    output = ok(doctor())
    assert "AWS image us-east-1 arm64" in output and "fail" not in output


def test_a_missing_bucket_and_a_dead_queue_fail_with_how_to_fix_them(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKER_CHECKPOINT_BUCKET", "no-such-bucket")
    monkeypatch.setenv("BROKER_CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
    result = doctor()
    output = failed(result)
    assert result.exit_code == 1
    assert "2 check(s) failed" in output
    checks = _by_name(run_checks(get_settings()))
    assert checks["checkpoint bucket"].failed
    assert "NoSuchBucket" in checks["checkpoint bucket"].detail
    assert "create the bucket s3://no-such-bucket" in checks["checkpoint bucket"].fix
    assert checks["task queue"].failed
    assert "BROKER_CELERY_BROKER_URL" in checks["task queue"].fix
    assert "s3://no-such-bucket" in output and "BROKER_CELERY_BROKER_URL" in output


def test_schema_profile_images_and_gcp_failures_each_name_their_fix(
    env: dict[str, str], tmp_path: Path
) -> None:
    settings = Settings().model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'empty.db'}",
            "aws_instance_profile": "no-such-profile",
            "aws_image_owners": ["amazon"],
            "aws_image_ids": {},
            "gcp_endpoint_url": "http://127.0.0.1:9",
        }
    )
    checks = _by_name(run_checks(settings))  # the default timeout: a loaded machine is slow
    assert checks["database"].status == "ok"
    assert "no schema" in checks["database schema"].detail
    assert checks["database schema"].fix == "run `broker db upgrade`"
    assert "NoSuchEntity" in checks["AWS instance profile"].detail
    assert "create-instance-profile" in checks["AWS instance profile"].fix
    image = checks["AWS image us-east-1 arm64"]
    assert image.failed and "us-east-1/arm64" in image.fix
    assert checks["GCP API"].failed and "BROKER_GCP_PROJECT" in checks["GCP API"].fix


def test_a_dead_billing_endpoint_fails_and_says_the_bundled_prices_stay(
    env: dict[str, str],
) -> None:
    settings = Settings().model_copy(update={"gcp_billing_endpoint_url": "http://127.0.0.1:9"})
    billing = _by_name(run_checks(settings))["GCP Cloud Billing"]
    assert billing.failed
    assert "BROKER_GCP_BILLING_ENDPOINT_URL" in billing.fix and "bundled GCP prices" in billing.fix
