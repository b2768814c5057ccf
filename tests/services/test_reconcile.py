"""Reconcile through the real local clouds (moto and the GCE fake): one instance that refuses
to terminate, or one region that does not answer, no longer stops the pass; an unknown
instance is terminated only once old enough; no transaction is open during a cloud call."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session

from broker import clock
from broker.clock import ManualClock
from broker.db.models import Attempt, Job
from broker.services import lifecycle
from broker.services.reconcile import reconcile
from providers.aws import AwsProvider
from providers.base import InstanceRef, InstanceState, LaunchRequest, ManagedInstance, Provider
from providers.gcp import GcpProvider
from providers.local import Fault, LocalCloud
from providers.local.stack import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from providers.retry import RetryPolicy
from tests.helpers import LEASE, chosen

AWS_ZONE = "use1-az6"  # moto's zone id of us-east-1a
REGIONS = {"aws": ["us-east-1"], "gcp": ["us-central1"]}
MIN_AGE = 600.0
GCP_PLAN = {
    "provider": "gcp",
    "region": "us-central1",
    "zone": "us-central1-a",
    "instance_type": "n1-standard-8-v100",
    "gpu": "V100",
    "gpu_count": 1,
    "market": "on_demand",
}
# Two quick tries per call, so a test knows how many injected faults exhaust one call.
TWO_TRIES = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.02, total_seconds=5.0)


@pytest.fixture(scope="module")
def cloud_clock() -> ManualClock:
    """The GCE fake's clock: it stamps its instances' creation time."""
    return ManualClock(datetime(2024, 3, 1, tzinfo=UTC))


@pytest.fixture(scope="module")
def cloud(cloud_clock: ManualClock) -> Iterator[LocalCloud]:
    with LocalCloud(
        aws_regions=["us-east-1"],
        gcp_zones=["us-central1-a"],
        market_interval_seconds=None,
        clock=cloud_clock,
    ) as local:
        local.market.set_available("aws", "us-east-1a", "*", True)
        local.market.set_available("gcp", "us-central1-a", "*", True)
        yield local


@pytest.fixture
def providers(cloud: LocalCloud) -> Iterator[dict[str, Provider]]:
    built: dict[str, Provider] = {
        "aws": AwsProvider.from_settings(cloud.settings(), retry=TWO_TRIES, regions=REGIONS["aws"]),
        "gcp": GcpProvider.from_settings(
            cloud.settings(), retry=TWO_TRIES, zones=["us-central1-a"]
        ),
    }
    yield built
    cloud.faults.reset()
    for name, provider in built.items():  # leave the shared clouds empty for the next test
        for region in REGIONS[name]:
            for ref in provider.list_managed(region):
                if name == "aws":
                    _ec2(cloud).modify_instance_attribute(
                        InstanceId=ref.instance_id, DisableApiTermination={"Value": False}
                    )
                provider.terminate(ref)


@pytest.fixture
def aged(clock: ManualClock) -> ManualClock:
    """The broker clock past the minimum age of anything launched now (moto stamps
    ``LaunchTime`` with wall time)."""
    clock.set(datetime.now(UTC) + timedelta(seconds=MIN_AGE + 120))
    return clock


def _ec2(cloud: LocalCloud) -> Any:
    return boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=cloud.aws_endpoint_url,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
    )


def _orphan(provider: Provider) -> InstanceRef:
    """An instance tagged as the broker's for an attempt the database never heard of."""
    token = f"att_{uuid.uuid4().hex[:12]}"
    where = (
        {"region": "us-east-1", "zone": AWS_ZONE, "instance_type": "p3.2xlarge"}
        if provider.name == "aws"
        else {"region": "us-central1", "zone": "us-central1-a", "instance_type": "n1-standard-8"}
    )
    return provider.launch(
        LaunchRequest(
            token=token,
            provider=provider.name,
            market="on_demand",
            gpu="V100",
            tags={"broker-job": "job_gone", "broker-attempt": token, "broker-team": "vision"},
            **where,
        )
    )


def _running(session: Session, job: Job, plan: dict[str, Any], instance_id: str) -> Attempt:
    """A running attempt of ``job`` on ``plan`` whose instance ``instance_id`` no cloud has."""
    begun = lifecycle.begin_attempt(session, job.id, chosen(plan, 1_000_000), clock.now())
    assert begun is not None
    attempt, _token = begun
    lifecycle.launch_succeeded(session, attempt.id, instance_id, clock.now(), lease_seconds=LEASE)
    return attempt


def _status(session: Session, attempt_id: str) -> str:
    session.expire_all()
    attempt = session.get(Attempt, attempt_id)
    assert attempt is not None
    return attempt.status


def test_an_instance_that_refuses_to_terminate_does_not_stop_the_pass(
    cloud: LocalCloud,
    providers: dict[str, Provider],
    db_engine: Engine,
    session: Session,
    submit: Any,
    run_spot: Any,
    aged: ManualClock,
) -> None:
    stuck = _orphan(providers["aws"])
    _ec2(cloud).modify_instance_attribute(
        InstanceId=stuck.instance_id, DisableApiTermination={"Value": True}
    )
    aws_orphan = _orphan(providers["aws"])
    gcp_orphan = _orphan(providers["gcp"])
    vanished, _ = run_spot(submit())  # running in aws us-east-1, instance "i-1" is nowhere

    report = reconcile(db_engine, providers, min_age_seconds=MIN_AGE)

    # (the local cloud is the module's: an earlier test's instance, its rows emptied since,
    # is an orphan too; CI's PostgreSQL run once saw one)
    terminated = set(report.orphans_terminated)
    assert {aws_orphan.instance_id, gcp_orphan.instance_id} <= terminated
    assert stuck.instance_id not in terminated
    assert [(f.action, f.instance_id) for f in report.failures] == [
        ("terminate", stuck.instance_id)
    ]
    assert "OperationNotPermitted" in report.failures[0].error
    assert providers["aws"].describe(stuck).status == "running"
    assert providers["aws"].describe(aws_orphan).status == "terminated"
    assert providers["gcp"].describe(gcp_orphan).status in ("terminated", "stopping")
    # The listing of us-east-1 was whole: the attempt whose instance vanished is still found.
    assert report.attempts_marked_gone == [vanished.id]
    assert _status(session, vanished.id) != lifecycle.RUNNING


def test_a_region_that_does_not_answer_is_skipped_and_its_attempts_left_alone(
    cloud: LocalCloud,
    providers: dict[str, Provider],
    db_engine: Engine,
    session: Session,
    submit: Any,
    run_spot: Any,
    aged: ManualClock,
) -> None:
    gcp_orphan = _orphan(providers["gcp"])
    aws_attempt, _ = run_spot(submit())
    gcp_attempt = _running(session, submit(budget=2_000_000_000), GCP_PLAN, "gone-1")
    cloud.faults.fail_next(2, Fault.SERVER_ERROR)  # both tries of the first call: EC2's listing

    report = reconcile(db_engine, providers, min_age_seconds=MIN_AGE)

    assert [(f.provider, f.region, f.action, f.instance_id) for f in report.failures] == [
        ("aws", "us-east-1", "list", None)
    ]
    assert report.orphans_terminated == [gcp_orphan.instance_id]
    # Unseen in a region that was not listed is not gone; unseen in a listed one is.
    assert report.attempts_marked_gone == [gcp_attempt.id]
    assert _status(session, aws_attempt.id) == lifecycle.RUNNING
    assert _status(session, gcp_attempt.id) != lifecycle.RUNNING


def test_an_unknown_instance_is_kept_while_young_and_terminated_once_old(
    cloud: LocalCloud,
    cloud_clock: ManualClock,
    providers: dict[str, Provider],
    db_engine: Engine,
    clock: ManualClock,
) -> None:
    clock.set(cloud_clock.now())
    orphan = _orphan(providers["gcp"])  # created at the GCE fake's clock: now

    clock.advance(MIN_AGE - 60)
    young = reconcile(db_engine, providers, min_age_seconds=MIN_AGE)

    assert young.orphans_terminated == []
    assert young.young_unknown == [orphan.instance_id]
    assert providers["gcp"].describe(orphan).status == "running"

    clock.advance(120)
    old = reconcile(db_engine, providers, min_age_seconds=MIN_AGE)

    assert old.orphans_terminated == [orphan.instance_id]
    assert old.young_unknown == []
    assert providers["gcp"].describe(orphan).status == "terminated"


class _NoTransactionDuringCalls:
    """A real provider whose every call first checks that no database transaction is open
    on ``engine`` (counted from the engine's begin, commit and rollback events)."""

    def __init__(self, inner: Provider, engine: Engine) -> None:
        self.inner, self.name = inner, inner.name
        self.open = 0
        self.calls: list[str] = []
        event.listen(engine, "begin", self._began)
        event.listen(engine, "commit", self._ended)
        event.listen(engine, "rollback", self._ended)
        self.engine = engine

    def _began(self, connection: Connection) -> None:
        self.open += 1

    def _ended(self, connection: Connection) -> None:
        self.open = max(0, self.open - 1)

    def detach(self) -> None:
        event.remove(self.engine, "begin", self._began)
        event.remove(self.engine, "commit", self._ended)
        event.remove(self.engine, "rollback", self._ended)

    def _check(self, call: str) -> None:
        assert self.open == 0, f"{call} called with a database transaction open"
        self.calls.append(call)

    def regions(self) -> list[str]:
        return self.inner.regions()

    def list_managed(self, region: str) -> list[ManagedInstance]:
        self._check("list_managed")
        return self.inner.list_managed(region)

    def describe(self, ref: InstanceRef) -> InstanceState:
        self._check("describe")
        return self.inner.describe(ref)

    def describe_many(self, refs: Any) -> dict[InstanceRef, InstanceState | None]:
        self._check("describe_many")
        return self.inner.describe_many(refs)

    def terminate(self, ref: InstanceRef) -> None:
        self._check("terminate")
        self.inner.terminate(ref)

    def launch(self, request: LaunchRequest) -> InstanceRef:
        self._check("launch")
        return self.inner.launch(request)


def test_no_database_transaction_is_open_during_a_cloud_call(
    providers: dict[str, Provider],
    db_engine: Engine,
    session: Session,
    submit: Any,
    run_spot: Any,
    aged: ManualClock,
) -> None:
    orphans = [_orphan(providers["aws"]), _orphan(providers["gcp"])]
    known, _ = run_spot(submit())
    session.close()  # the test's own session holds no transaction either
    checked = {name: _NoTransactionDuringCalls(p, db_engine) for name, p in providers.items()}
    try:
        report = reconcile(db_engine, checked, min_age_seconds=MIN_AGE)  # type: ignore[arg-type]
    finally:
        for wrapper in checked.values():
            wrapper.detach()

    assert sorted(report.orphans_terminated) == sorted(o.instance_id for o in orphans)
    assert report.attempts_marked_gone == [known.id]  # "i-1" is in no cloud
    assert checked["aws"].calls == ["list_managed", "terminate"]
    assert checked["gcp"].calls == ["list_managed", "terminate"]


def test_an_ended_attempts_instance_is_terminated_as_cleanup_not_counted_an_orphan(
    providers: dict[str, Provider],
    db_engine: Engine,
    session: Session,
    submit: Any,
    aged: ManualClock,
) -> None:
    job = submit()
    begun = lifecycle.begin_attempt(session, job.id, chosen(GCP_PLAN, 1_000_000), clock.now())
    assert begun is not None
    attempt, _ = begun
    ref = providers["gcp"].launch(
        LaunchRequest(
            token=attempt.id,
            provider="gcp",
            region="us-central1",
            zone="us-central1-a",
            instance_type="n1-standard-8",
            market="on_demand",
            gpu="V100",
            tags={"broker-job": job.id, "broker-attempt": attempt.id, "broker-team": "vision"},
        )
    )
    lifecycle.launch_succeeded(
        session, attempt.id, ref.instance_id, clock.now(), lease_seconds=LEASE
    )
    # the job is cancelled; the terminate its end asked for has not reached the cloud yet
    lifecycle.cancel(session, job.team_id, job.id, clock.now())
    orphan = _orphan(providers["gcp"])

    report = reconcile(db_engine, providers, min_age_seconds=MIN_AGE)

    assert report.ended_terminated == [ref.instance_id]
    assert report.orphans_terminated == [orphan.instance_id]
    assert providers["gcp"].describe(ref).status in ("terminated", "stopping")
