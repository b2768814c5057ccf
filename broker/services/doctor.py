"""``broker doctor``: whether this broker can run jobs, one check per thing it relies on.

Every check reports what it found; a failed one says what is wrong and how to fix it. The
checks never raise: a broken dependency is a result, not a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from kombu import Connection
from kombu.utils.url import maybe_sanitize_url
from sqlalchemy.engine import make_url

from broker.db.engine import make_engine
from broker.db.migrate import alembic_config
from broker.services.price_refresh import boto_session
from broker.services.quoting import launchable
from broker.settings import Settings
from pricing.catalog import bundled_catalog
from providers.aws import AwsProvider
from providers.gcp import GcpProvider, is_local_endpoint
from providers.gcp_instance import architecture as gcp_architecture
from providers.retry import RetryPolicy

Status = Literal["ok", "fail", "skip"]


@dataclass(frozen=True)
class Check:
    """One thing the broker relies on: ``ok``, ``fail`` (with a ``fix``) or ``skip``."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def run_checks(settings: Settings, *, timeout: float = 5.0) -> list[Check]:
    """Database, task queue, AWS (credentials, images, instance profile, bucket), GCP and
    the clouds' pricing APIs."""
    retry = RetryPolicy(attempts=2, initial_wait=0.2, max_wait=1.0, total_seconds=2 * timeout)
    return [
        *database_checks(settings),
        celery_check(settings, timeout),
        *aws_checks(settings, retry, timeout),
        *gcp_checks(settings, retry, timeout),
        *pricing_checks(settings),
    ]


def _attempt(name: str, fix: str, probe: Callable[[], str]) -> Check:
    try:
        return Check(name, "ok", probe())
    except Exception as exc:  # a doctor reports every failure; it never stops at one
        return _failed(name, fix, exc)


def _failed(name: str, fix: str, exc: Exception) -> Check:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return Check(name, "fail", reason[:400], fix)


def database_checks(settings: Settings) -> list[Check]:
    """The database answers, and its schema is the one this code needs."""
    url = settings.resolved_database_url
    shown = make_url(url).render_as_string(hide_password=True)
    heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
    current: set[str] = set()

    def connect() -> str:
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                current.update(MigrationContext.configure(connection).get_current_heads())
        finally:
            engine.dispose()
        return shown

    reached = _attempt(
        "database",
        "check BROKER_DATABASE_URL and that the database server is up and accepts the user",
        connect,
    )
    if reached.failed:
        return [reached, Check("database schema", "skip", "the database is unreachable")]

    def schema() -> str:
        if current != heads:
            found = ", ".join(sorted(current)) or "no schema"
            raise RuntimeError(f"at {found}; this broker needs {', '.join(sorted(heads))}")
        return f"at {', '.join(sorted(heads))} (newest)"

    return [reached, _attempt("database schema", "run `broker db upgrade`", schema)]


def celery_check(settings: Settings, timeout: float) -> Check:
    """The Celery broker (the workers' task queue) accepts a connection."""
    url = settings.resolved_celery_broker_url
    shown = url if url == "filesystem://" else maybe_sanitize_url(url)
    connection = Connection(
        url,
        transport=settings.celery_transport,
        transport_options=settings.celery_transport_options(),
        connect_timeout=timeout,
    )

    def connect() -> str:
        try:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
        finally:
            connection.release()
        return shown

    return _attempt(
        "task queue",
        f"start the message broker at {shown} or point BROKER_CELERY_BROKER_URL at a running "
        "one (e.g. redis://host:6379/0)",
        connect,
    )


def aws_checks(settings: Settings, retry: RetryPolicy, timeout: float) -> list[Check]:
    """Credentials, an image per region and architecture, the instance profile, the bucket."""
    aws = AwsProvider.from_settings(
        settings, retry=retry, connect_timeout=timeout, read_timeout=2 * timeout
    )
    identity = _attempt(
        "AWS credentials",
        "set BROKER_AWS_ACCESS_KEY_ID and BROKER_AWS_SECRET_ACCESS_KEY (or give the broker's "
        "host a role), and check BROKER_AWS_ENDPOINT_URL",
        aws.caller_identity,
    )
    if identity.failed:
        return [identity, Check("AWS images, profile, bucket", "skip", "no working credentials")]
    return [
        identity,
        *aws_image_checks(aws, settings),
        instance_profile_check(aws, settings.aws_instance_profile),
        bucket_check(aws, settings.checkpoint_bucket, settings.aws_region),
    ]


def bucket_check(aws: AwsProvider, bucket: str, region: str) -> Check:
    """The checkpoint bucket takes an object (and lets it be deleted)."""

    def probe() -> str:
        aws.probe_bucket(bucket, region)
        return f"s3://{bucket}: put and delete work"

    return _attempt(
        "checkpoint bucket",
        f"create the bucket s3://{bucket} in {region} or set BROKER_CHECKPOINT_BUCKET to one; "
        "the broker's credentials need s3:PutObject, s3:GetObject and s3:DeleteObject on it",
        probe,
    )


def aws_image_checks(aws: AwsProvider, settings: Settings) -> list[Check]:
    """For every configured region, an image for each architecture its catalog offers need."""
    offers = launchable(bundled_catalog(), settings.aws_regions, [])
    checks = []
    for region in settings.aws_regions:
        types = sorted({str(t) for t in offers.instance_type[offers.region == region]})
        if not types:
            checks.append(Check(f"AWS image {region}", "skip", "no catalog offers there"))
            continue
        by_arch: dict[str, list[str]] = {}
        arch_check = _attempt(
            f"AWS architectures {region}",
            "the credentials need ec2:DescribeInstanceTypes",
            partial(_group_by_architecture, aws, region, types, by_arch),
        )
        if arch_check.failed:
            checks.append(arch_check)
            continue
        for arch, uses in sorted(by_arch.items()):
            example = json.dumps({f"{region}/{arch}": "ami-..."})
            checks.append(
                _attempt(
                    f"AWS image {region} {arch}",
                    f"set BROKER_AWS_IMAGE_IDS='{example}' to an AMI with the NVIDIA driver, "
                    "Docker and the NVIDIA container toolkit (or check BROKER_AWS_IMAGE_OWNERS)",
                    lambda r=region, a=arch, u=uses: f"{aws.setup.image(r, a)} for {_some(u)}",
                )
            )
    return checks


def _group_by_architecture(
    aws: AwsProvider, region: str, types: list[str], into: dict[str, list[str]]
) -> str:
    for instance_type in types:
        into.setdefault(aws.setup.architecture(region, instance_type), []).append(instance_type)
    return ", ".join(sorted(into))


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def instance_profile_check(aws: AwsProvider, profile: str | None) -> Check:
    """The IAM instance profile the instances launch with exists (when one is set)."""
    if not profile:
        return Check(
            "AWS instance profile",
            "skip",
            "BROKER_AWS_INSTANCE_PROFILE not set: instances "
            "get no AWS credentials (the agent needs none)",
        )
    return _attempt(
        "AWS instance profile",
        f"create it (aws iam create-instance-profile --instance-profile-name {profile}, then "
        "add-role-to-instance-profile) or unset BROKER_AWS_INSTANCE_PROFILE; the broker's "
        "credentials also need iam:PassRole on its role",
        lambda: aws.instance_profile_arn(profile),
    )


def gcp_checks(settings: Settings, retry: RetryPolicy, timeout: float) -> list[Check]:
    """The Compute API answers for the project and its zones; on Google's API also the
    instances' service account and an image per architecture."""
    fix = (
        "check BROKER_GCP_PROJECT, BROKER_GCP_ZONES and the credentials "
        "(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)"
    )
    try:
        gcp = GcpProvider.from_settings(settings, retry=retry, timeout=timeout)
    except Exception as exc:  # e.g. no default credentials on this host
        reached = _failed("GCP API", fix, exc)
    else:
        reached = _attempt("GCP API", fix, lambda: _zones_found(gcp, settings.gcp_zones))
    if is_local_endpoint(settings.gcp_endpoint_url):
        return [
            reached,
            Check("GCP service account", "skip", "the local GCE fake"),
            Check("GCP images", "skip", "the local GCE fake"),
        ]
    account = Check("GCP service account", "ok", settings.gcp_service_account or "")
    if not settings.gcp_service_account:
        account = Check(
            "GCP service account",
            "fail",
            "BROKER_GCP_SERVICE_ACCOUNT is not set",
            "set it to <name>@<project>.iam.gserviceaccount.com, an account the broker's "
            "credentials may act as (roles/iam.serviceAccountUser)",
        )
    if reached.failed:
        return [reached, account, Check("GCP images", "skip", "the GCP API is unreachable")]
    offers = launchable(bundled_catalog(), [], settings.gcp_zones)
    arches = sorted({gcp_architecture(str(t)) for t in offers.instance_type})
    images = [
        _attempt(
            f"GCP image {arch}",
            f"set BROKER_GCP_IMAGE_FAMILIES to an image family of {settings.gcp_image_project} "
            "for it (or BROKER_GCP_IMAGE_PROJECT)",
            lambda a=arch: gcp.image_from_family(a),
        )
        for arch in arches
    ]
    return [reached, account, *images]


def pricing_checks(settings: Settings) -> list[Check]:
    """The clouds' pricing APIs the price refresh asks: AWS Price List and spot price history,
    GCP Cloud Billing Catalog (the broker plans on the bundled prices without them)."""
    from pricing.refresh import probe_aws, probe_gcp

    offers = launchable(bundled_catalog(), settings.aws_regions, [])
    checks = []
    if len(offers.instance_type):
        region, instance_type = str(offers.region[0]), str(offers.instance_type[0])
        session = boto_session(settings)
        checks.append(
            _attempt(
                "AWS pricing APIs",
                "the credentials need pricing:GetProducts and ec2:DescribeSpotPriceHistory "
                "(until then the broker plans on its bundled AWS prices)",
                lambda: probe_aws(session, settings.aws_endpoint_url, region, instance_type),
            )
        )
    if settings.gcp_zones:
        checks.append(
            _attempt(
                "GCP Cloud Billing",
                "enable the Cloud Billing API (cloudbilling.googleapis.com) for the credentials' "
                "project, or set BROKER_GCP_BILLING_ENDPOINT_URL (until then the broker plans "
                "on its bundled GCP prices)",
                lambda: probe_gcp(settings.gcp_billing_endpoint_url),
            )
        )
    return checks


def _zones_found(gcp: GcpProvider, wanted: list[str]) -> str:
    zones = set(gcp.zone_names())
    missing = [zone for zone in wanted if zone not in zones]
    if missing:
        raise RuntimeError(f"project {gcp.project} has no zone {', '.join(missing)}")
    return f"project {gcp.project}: the {len(wanted)} configured zones answer"
