"""Batched observation (issue 19): a batch of live attempts over both local clouds and several
regions is described with one cloud call per region, every attempt's spend is booked at the
cloud's answer, and an instance gone from the cloud ends only its own attempt."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session, col, select

from broker.clock import ManualClock
from broker.db.engine import is_postgres
from broker.db.models import Attempt, LedgerEntry
from broker.services import admission, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.ledger import SPEND
from broker.services.quoting import get_planning
from broker.services.runner import Runner
from broker.services.teams import create_team
from broker.services.watching import claim
from providers.aws import AwsProvider
from providers.base import TAG_ATTEMPT, TAG_JOB, TAG_TEAM, InstanceRef, LaunchRequest, Provider
from providers.gcp import GcpProvider
from providers.local import LocalCloud
from tests.helpers import chosen

WHERE = [
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge"),
    ("aws", "us-west-2", "us-west-2a", "p3.2xlarge"),
    ("gcp", "us-central1", "us-central1-a", "n1-standard-8"),
    ("gcp", "us-east1", "us-east1-b", "n1-standard-8"),
]
PRICE = 3_060_000
SPEC = {
    "name": "batch",
    "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 40000},
    "resources": {"gpus": 1, "gpu_types": ["V100"]},
    "deadline": "2027-06-01T12:00:00Z",
    "max_cost": "100.00",
    "market": "on_demand",
    "run": {"command": "python train.py"},
}


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(
        aws_regions=["us-east-1", "us-west-2"],
        gcp_zones=["us-central1-a", "us-east1-b"],
        market_interval_seconds=None,
        clock=ManualClock(datetime(2024, 3, 1, tzinfo=UTC)),
        instance_runner="light",
    ) as local:
        yield local


def _providers(cloud: LocalCloud) -> dict[str, Provider]:
    settings = cloud.settings()
    return {
        "aws": AwsProvider.from_settings(settings, regions=["us-east-1", "us-west-2"]),
        "gcp": GcpProvider.from_settings(settings),
    }


def _populate(
    session: Session, providers: dict[str, Provider], now: datetime, count: int, name: str = "batch"
) -> Any:
    team = create_team(session, name, 10**12, "month", 0.8, now)
    spec = JobSpec.model_validate(SPEC)
    ids = []
    for n in range(count):
        provider, region, zone, instance_type = WHERE[n % len(WHERE)]
        job, _ = admission.submit(session, team.id, spec, now)
        where = {
            "provider": provider,
            "region": region,
            "zone": zone,
            "instance_type": instance_type,
            "gpu": "V100",
            "gpu_count": 1,
            "market": "on_demand",
        }
        begun = lifecycle.begin_attempt(session, job.id, chosen(where, PRICE), now)
        assert begun is not None
        attempt, _ = begun
        ref = providers[provider].launch(
            LaunchRequest(
                token=attempt.id,
                provider=provider,
                region=region,
                zone=zone,
                instance_type=instance_type,
                market="on_demand",
                gpu="V100",
                tags={TAG_JOB: job.id, TAG_ATTEMPT: attempt.id, TAG_TEAM: team.id},
            )
        )
        lifecycle.launch_succeeded(session, attempt.id, ref.instance_id, now, lease_seconds=86400)
        ids.append(attempt.id)
    return ids


def test_a_batch_is_described_once_per_region_books_every_attempt_and_ends_only_the_gone_one(
    session: Session, db_engine: Any, clock: Any, cloud: LocalCloud
) -> None:
    providers = _providers(cloud)
    ids = _populate(session, providers, clock.now(), 12)
    hands = _hands(db_engine, providers)
    gone = session.get(Attempt, ids[1])
    assert gone is not None and gone.instance_id
    providers["aws"].terminate(InstanceRef("aws", gone.region, gone.zone, gone.instance_id))

    served = [0]
    decide = cloud.faults.decide

    def counted() -> Any:  # every request the local clouds serve asks the injector once
        served[0] += 1
        return decide()

    cloud.faults.decide = counted  # type: ignore[method-assign]
    try:
        clock.advance(600)
        regions = hands.observe_many(ids)
    finally:
        cloud.faults.decide = decide  # type: ignore[method-assign]

    assert regions == 4
    # one describe per region, nothing per attempt that is up; the EC2 instance that is gone
    # is described once more in full (its status call only says it is not up)
    assert served[0] == 5
    session.rollback()  # end the test's read, which began before the batch
    attempts = {a.id: a for a in session.exec(select(Attempt)).all() if a.id in ids}
    assert attempts[ids[1]].status == "ended" and attempts[ids[1]].end_reason == "preempted"
    for attempt_id in ids:
        if attempt_id == ids[1]:
            continue
        attempt = attempts[attempt_id]
        assert attempt.status == "running", attempt.end_reason
        assert attempt.billed_seconds == pytest.approx(600)
    for attempt_id in ids:
        hands.terminate(lifecycle.attempt_instances(session, attempts[attempt_id]))


def _hands(db_engine: Any, providers: dict[str, Provider]) -> Runner:
    return Runner(
        db_engine,
        providers,
        get_planning(),
        agent_secret="s",
        api_url="http://127.0.0.1:9",
        tick_seconds=5.0,
        agent_silence_seconds=1e9,
    )


def _spends(session: Session, ids: list[str]) -> dict[str, int]:
    session.rollback()
    rows = session.exec(
        select(LedgerEntry.attempt_id).where(
            LedgerEntry.kind == SPEND, col(LedgerEntry.attempt_id).in_(ids)
        )
    ).all()
    return {attempt_id: rows.count(attempt_id) for attempt_id in ids}


def test_two_workers_handed_one_ticks_batch_observe_each_attempt_once(
    session: Session, db_engine: Any, clock: Any, cloud: LocalCloud
) -> None:
    """A tick's batch delivered to two workers at once (a duplicate, a redelivery): each
    attempt is claimed by one of them, observed and billed once; the next tick observes it
    again; the same tick's batch handed over once more observes nothing."""
    providers = _providers(cloud)
    ids = _populate(session, providers, clock.now(), 8, name="two-workers")
    workers = [_hands(db_engine, _providers(cloud)) for _ in range(2)]
    try:
        clock.advance(300)
        tick = clock.now()
        start = threading.Barrier(2)

        def work(runner: Runner) -> None:
            start.wait()
            runner.observe_many(ids, tick=tick)

        threads = [threading.Thread(target=work, args=(w,)) for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert _spends(session, ids) == dict.fromkeys(ids, 1)

        assert workers[0].observe_many(ids, tick=tick) == 0  # the same tick again: no call
        assert _spends(session, ids) == dict.fromkeys(ids, 1)

        clock.advance(300)
        assert workers[1].observe_many(ids, tick=clock.now()) == 4
        assert _spends(session, ids) == dict.fromkeys(ids, 2)
        billed = [a.billed_seconds for a in session.exec(select(Attempt)) if a.id in ids]
        assert billed == [pytest.approx(600)] * len(ids)
    finally:
        for attempt in session.exec(select(Attempt)).all():
            if attempt.id in ids:
                workers[0].terminate(lifecycle.attempt_instances(session, attempt))


def test_a_claim_skips_an_attempt_another_transaction_holds_rather_than_wait_for_it(
    session: Session, db_engine: Any, clock: Any, cloud: LocalCloud
) -> None:
    """On PostgreSQL a claim waits for no row lock: one attempt of the batch held by another
    transaction (a booking of it under way) is left to the next tick, the rest are claimed
    at once. Waiting, it could deadlock with a batch booking the same attempts in another
    order (the soak's ``deadlock detected``)."""
    if not is_postgres(session):
        pytest.skip("row locks are PostgreSQL's; SQLite's one writer cannot deadlock")
    ids = _populate(session, _providers(cloud), clock.now(), 3, name="claim-skips")
    tick = clock.now()
    with Session(db_engine) as other:
        other.exec(select(Attempt).where(Attempt.id == ids[1]).with_for_update()).one()
        with Session(db_engine) as claimer:
            claimer.connection().exec_driver_sql("SET lock_timeout = '5s'")
            assert claim(claimer, ids, tick) == [ids[0], ids[2]]
        other.rollback()
    with Session(db_engine) as claimer:
        assert claim(claimer, ids, tick) == [ids[1]]  # once free, claimed for the same tick
