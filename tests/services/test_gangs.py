"""Gang attempts (issue 20) through the runner, the real adapters and the local clouds (moto
behind the broker's middleware, the GCE fake): every node launched with its own token into
one cluster placement group, a partial gang rolled back, one node lost stops the gang, the
ledger bills every node, a crash between two node launches leaves a launch that a retry
finishes on the same instances, and reconcile knows a gang's nodes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from sqlmodel import Session, col, select

from broker.clock import ManualClock
from broker.core.money import cost_micros
from broker.db.models import Attempt, AttemptNode, Job, LedgerEntry
from broker.services import lifecycle
from broker.services.agent_reports import report_progress
from broker.services.launch_request import agent_token, launch_request
from broker.services.plans import ChosenPlan
from broker.services.quoting import get_planning
from broker.services.reconcile import reconcile
from broker.services.runner import Runner
from providers.aws import AwsProvider
from providers.base import InstanceRef
from providers.boot import script_exports as exported
from providers.gcp import GcpProvider
from providers.local import LocalCloud
from providers.local.stack import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from providers.retry import RetryPolicy
from tests.helpers import chosen

SECRET = "gang-secret"
API_URL = "http://127.0.0.1:9"  # nothing listens: the light instances' calls are refused
ZONE_ID, ZONE = "use1-az6", "us-east-1a"  # moto's us-east-1a
ON_DEMAND = 3_060_000  # p3.2xlarge on demand, micro-dollars an hour (one node)
GANG_WHERE = {
    "provider": "aws",
    "region": "us-east-1",
    "zone": ZONE_ID,
    "instance_type": "p3.2xlarge",
    "gpu": "V100",
    "gpu_count": 1,
    "market": "on_demand",
}
AWS_ONLY = {"gpus": 1, "gpu_types": ["V100"], "providers": ["aws"], "regions": ["us-east-1"]}
TWO_TRIES = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.02, total_seconds=5.0)


def gang_plan(nodes: int) -> ChosenPlan:
    """A plan of ``nodes`` p3.2xlarge on demand in us-east-1a, priced as the whole gang."""
    return dataclasses.replace(chosen(GANG_WHERE, nodes * ON_DEMAND), nodes=nodes)


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(
        aws_regions=["us-east-1"],
        gcp_zones=["us-central1-a"],
        market_interval_seconds=None,
        clock=ManualClock(datetime(2024, 3, 1, tzinfo=UTC)),
        instance_runner="light",
    ) as local:
        local.market.set_available("aws", "*", "*", True)
        yield local


@pytest.fixture
def ec2(cloud: LocalCloud) -> Iterator[Any]:
    client = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=cloud.aws_endpoint_url,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
    )
    yield client
    cloud.aws.set_capacity(ZONE, "p3.2xlarge", None)
    live = _instances(client, {"instance-state-name": ["pending", "running"]})
    if live:  # leave the shared cloud empty for the next test
        client.terminate_instances(InstanceIds=[i["InstanceId"] for i in live])


@pytest.fixture
def hands(db_engine: Any, cloud: LocalCloud) -> Runner:
    aws = AwsProvider.from_settings(cloud.settings(), retry=TWO_TRIES, regions=["us-east-1"])
    return Runner(
        db_engine,
        {"aws": aws},
        get_planning(),
        agent_secret=SECRET,
        api_url=API_URL,
        tick_seconds=5.0,  # spend leases of 600 s: the tests observe every 300 s
        agent_silence_seconds=1e6,  # no agent reports here (the light instances reach no API)
    )


def _run_for(hands: Runner, clock: ManualClock, attempt_id: str, seconds: int) -> None:
    """Let ``seconds`` pass, observed every 300 s (within the 600 s spend lease)."""
    for _ in range(seconds // 300):
        clock.advance(300)
        hands.observe(attempt_id)


def _fresh(session: Session) -> None:
    """End the session's read (a SQLite read sees one snapshot) and forget what it loaded:
    the next read sees what the runner committed meanwhile."""
    session.rollback()
    session.expire_all()


def _instances(ec2: Any, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": k, "Values": v} for k, v in filters.items()]
    )
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _of_attempt(ec2: Any, attempt_id: str) -> dict[str, dict[str, Any]]:
    """The EC2 instances tagged with ``attempt_id`` (any state), by instance id."""
    found = _instances(ec2, {"tag:broker-attempt": [attempt_id]})
    return {i["InstanceId"]: i for i in found}


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def _nodes(session: Session, attempt_id: str) -> list[str | None]:
    rows = session.exec(
        select(AttemptNode)
        .where(AttemptNode.attempt_id == attempt_id)
        .order_by(col(AttemptNode.rank))
    ).all()
    assert [r.rank for r in rows] == list(range(len(rows)))
    return [r.instance_id for r in rows]


def _gang_job(session: Session, submit: Any, nodes: int) -> Job:
    """An admitted job whose first launch is a gang of ``nodes`` (as if its plan were)."""
    job = submit(market="on_demand", resources=AWS_ONLY)
    job.plan = gang_plan(nodes).to_json()
    session.add(job)
    session.commit()
    return job


def _attempts(session: Session, job_id: str) -> list[Attempt]:
    _fresh(session)
    return list(
        session.exec(
            select(Attempt)
            .where(Attempt.job_id == job_id)
            # one launch's attempts share the manual clock's instant: ids are time-ordered
            .order_by(col(Attempt.created_at), col(Attempt.id))
        ).all()
    )


def test_a_gang_launches_every_node_with_its_own_token_into_one_placement_group(
    session, clock, submit, hands, ec2
):
    job = _gang_job(session, submit, 3)

    attempt_id = hands.launch(job.id)

    (attempt,) = _attempts(session, job.id)
    assert attempt.id == attempt_id and attempt.status == "running" and attempt.nodes == 3
    assert attempt.price_micros_per_hour == 3 * ON_DEMAND  # the gang's price
    nodes = _nodes(session, attempt.id)
    assert len(nodes) == 3 and attempt.instance_id == nodes[0]
    found = _of_attempt(ec2, attempt.id)
    assert set(found) == set(nodes)
    for rank, instance_id in enumerate(nodes):
        instance = found[instance_id]
        assert instance["State"]["Name"] == "running"
        assert instance["Placement"]["AvailabilityZone"] == ZONE
        assert _tags(instance)["broker-node"] == str(rank)
        token = attempt.id if rank == 0 else f"{attempt.id}-n{rank}"
        assert instance["ClientToken"] == token
    groups = ec2.describe_placement_groups(GroupNames=[f"broker-gang-{ZONE_ID}"])
    assert [g["Strategy"] for g in groups["PlacementGroups"]] == ["cluster"]
    assert session.get(Job, job.id).status == "running"


def test_a_partial_gang_is_rolled_back_and_the_next_plan_is_tried(
    session, clock, submit, hands, ec2, cloud
):
    job = _gang_job(session, submit, 4)
    cloud.aws.set_capacity(ZONE, "p3.2xlarge", 3)  # room for 3 nodes of 4

    hands.launch(job.id)

    gang, *after = _attempts(session, job.id)
    assert (gang.nodes, gang.status, gang.end_reason) == (4, "ended", "capacity")
    started = _nodes(session, gang.id)
    assert len(started) == 3  # nodes 0..2 ran, node 3 was refused
    states = {i: x["State"]["Name"] for i, x in _of_attempt(ec2, gang.id).items()}
    assert states == {i: "terminated" for i in started}  # no orphan of the partial gang
    assert gang.cost_micros == 0  # it never ran as a gang: nothing billed
    # The next plan was tried and runs (its own instance, alive).
    assert after and after[-1].status == "running", [(a.nodes, a.end_reason) for a in after]
    # The re-plan keeps the gang's shape (quoting) and moves to another zone's offer.
    nxt = after[-1]
    assert nxt.nodes == 4 and (nxt.zone, nxt.instance_type) != (gang.zone, gang.instance_type)
    live = {i for i, x in _of_attempt(ec2, nxt.id).items() if x["State"]["Name"] == "running"}
    assert live == set(_nodes(session, nxt.id)) and len(live) == 4
    assert session.get(Job, job.id).status == "running"


def test_one_node_gone_preempts_the_gang_stops_every_node_and_the_job_relaunches(
    session, clock, submit, hands, ec2
):
    job = _gang_job(session, submit, 3)
    hands.launch(job.id)
    (attempt,) = _attempts(session, job.id)
    nodes = _nodes(session, attempt.id)
    _run_for(hands, clock, attempt.id, 1800)  # all nodes run: the gang runs on
    token = agent_token(SECRET, attempt.id, job.deadline)
    key = f"jobs/{job.id}/ckpt-1"
    report_progress(session, attempt.id, token, 100.0, key, clock.now())
    _fresh(session)
    assert session.get(Attempt, attempt.id).status == "running"

    ec2.terminate_instances(InstanceIds=[nodes[1]])  # one node taken
    clock.advance(60)
    hands.observe(attempt.id)

    _fresh(session)
    ended = session.get(Attempt, attempt.id)
    assert (ended.status, ended.end_reason) == ("ended", "preempted")
    states = {i: x["State"]["Name"] for i, x in _of_attempt(ec2, attempt.id).items()}
    assert states == {i: "terminated" for i in nodes}  # the other nodes stopped too
    job = session.get(Job, job.id)
    assert job.status == "preempted" and job.work_done == job.checkpointed_work == 100.0

    relaunched = hands.launch(job.id)
    _fresh(session)
    new = session.get(Attempt, relaunched)
    assert new.status == "running" and new.work_at_start == 100.0  # from the checkpoint
    # A new gang: the re-plan keeps the job's gang shape (quoting), every node running.
    assert new.nodes == 3 and len(_nodes(session, new.id)) == 3
    live = {i for i, x in _of_attempt(ec2, new.id).items() if x["State"]["Name"] == "running"}
    assert live == set(_nodes(session, new.id))
    assert session.get(Job, job.id).status == "running"


def test_the_ledger_bills_every_node_of_a_gang(session, clock, submit, hands, ec2):
    job = _gang_job(session, submit, 4)
    hands.launch(job.id)
    (attempt,) = _attempts(session, job.id)
    _run_for(hands, clock, attempt.id, 3600)  # each observation books the gang's spend
    hands.cancel(job.team_id, job.id)

    _fresh(session)
    attempt = session.get(Attempt, attempt.id)
    assert attempt.billed_seconds == 3600.0
    spent = sum(
        e.amount_micros
        for e in session.exec(select(LedgerEntry).where(LedgerEntry.job_id == job.id)).all()
        if e.kind == "spend"
    )
    assert spent == attempt.cost_micros == 4 * cost_micros(ON_DEMAND, 3600.0) == 12_240_000
    states = {x["State"]["Name"] for x in _of_attempt(ec2, attempt.id).values()}
    assert states == {"terminated"}  # a cancel terminates every node


_CRASHING_LAUNCH = textwrap.dedent(
    """
    import sys
    from datetime import datetime

    from broker.clock import ManualClock, set_clock
    from broker.db.engine import get_engine
    from broker.services.quoting import get_planning
    from broker.services.runner import Runner
    from broker.settings import get_settings
    from providers.aws import AwsProvider

    attempt_id, now, secret, api_url = sys.argv[1:5]
    set_clock(ManualClock(datetime.fromisoformat(now)))
    aws = AwsProvider.from_settings(get_settings(), regions=["us-east-1"])
    Runner(
        get_engine(), {"aws": aws}, get_planning(),
        agent_secret=secret, api_url=api_url, tick_seconds=5.0,
    ).observe(attempt_id)  # a launching attempt: observe launches it
    print("no crash")
    """
)


def test_a_crash_between_node_launches_then_a_retry_finds_the_same_instances(
    session, db_engine, clock, submit, hands, ec2, cloud
):
    job = _gang_job(session, submit, 3)
    begun = lifecycle.begin_attempt(session, job.id, gang_plan(3), clock.now())
    assert begun is not None
    attempt, _ = begun
    env = {
        **os.environ,
        **cloud.env,
        "BROKER_DATABASE_URL": db_engine.url.render_as_string(hide_password=False),
        "BROKER_FAULT_POINT": "between_nodes",
    }
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            _CRASHING_LAUNCH,
            attempt.id,
            clock.now().isoformat(),
            SECRET,
            API_URL,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr  # os._exit at the point
    _fresh(session)
    assert session.get(Attempt, attempt.id).status == "launching"
    before = _nodes(session, attempt.id)
    assert len(before) == 1  # node 0 launched and recorded, then the worker died
    assert set(_of_attempt(ec2, attempt.id)) == set(before)

    hands.observe(attempt.id)  # the retried launch: same tokens

    _fresh(session)
    attempt = session.get(Attempt, attempt.id)
    nodes = _nodes(session, attempt.id)
    assert attempt.status == "running" and nodes[0] == before[0] == attempt.instance_id
    found = _of_attempt(ec2, attempt.id)
    assert set(found) == set(nodes) and len(found) == 3  # no duplicate node
    assert sorted(_tags(i)["broker-node"] for i in found.values()) == ["0", "1", "2"]


def test_reconcile_knows_a_gangs_nodes_and_ends_the_gang_when_one_is_gone(
    session, db_engine, clock, submit, hands, ec2, cloud
):
    job = _gang_job(session, submit, 2)
    hands.launch(job.id)
    (attempt,) = _attempts(session, job.id)
    nodes = _nodes(session, attempt.id)
    aws = hands.providers
    clock.advance(60)

    quiet = reconcile(db_engine, aws, min_age_seconds=0.0)
    assert quiet.orphans_terminated == [] and quiet.attempts_marked_gone == []
    assert {x["State"]["Name"] for x in _of_attempt(ec2, attempt.id).values()} == {"running"}

    ec2.terminate_instances(InstanceIds=[nodes[1]])
    clock.advance(60)
    report = reconcile(db_engine, aws, min_age_seconds=0.0)

    assert report.attempts_marked_gone == [attempt.id]
    _fresh(session)
    assert session.get(Attempt, attempt.id).end_reason == "preempted"
    states = {i: x["State"]["Name"] for i, x in _of_attempt(ec2, attempt.id).items()}
    assert states == {i: "terminated" for i in nodes}


def test_each_node_of_a_gang_gets_its_token_rank_tag_and_boot_rank_and_one_placement(
    session, clock, submit
):
    job = submit(market="on_demand", resources=AWS_ONLY)
    begun = lifecycle.begin_attempt(session, job.id, gang_plan(3), clock.now())
    assert begun is not None
    attempt, _ = begun
    requests = [
        launch_request(job, attempt, api_url=API_URL, agent_secret=SECRET, node_rank=k)
        for k in range(3)
    ]
    assert [r.token for r in requests] == [attempt.id, f"{attempt.id}-n1", f"{attempt.id}-n2"]
    assert [r.tags["broker-node"] for r in requests] == ["0", "1", "2"]
    assert {r.tags["broker-attempt"] for r in requests} == {attempt.id}
    assert [exported(r.boot_script)["BROKER_NODE_RANK"] for r in requests] == ["0", "1", "2"]
    assert {exported(r.boot_script)["BROKER_AGENT_TOKEN"] for r in requests} == {
        agent_token(SECRET, attempt.id, job.deadline)
    }  # one token for the gang
    assert {r.placement_group for r in requests} == {f"broker-gang-{ZONE_ID}"}

    single = submit(budget=10**9 + 1, market="on_demand", resources=AWS_ONLY)
    alone, _ = lifecycle.begin_attempt(session, single.id, gang_plan(1), clock.now())
    request = launch_request(single, alone, api_url=API_URL, agent_secret=SECRET)
    assert "broker-node" not in request.tags and request.placement_group is None


def test_a_gang_on_gce_launches_every_node_and_stops_whole_when_one_is_deleted(
    session, db_engine, clock, submit, cloud
):
    gcp = GcpProvider.from_settings(cloud.settings(), retry=TWO_TRIES, zones=["us-central1-a"])
    hands = Runner(
        db_engine,
        {"gcp": gcp},
        get_planning(),
        agent_secret=SECRET,
        api_url=API_URL,
        tick_seconds=5.0,
        agent_silence_seconds=1e6,
    )
    job = submit(
        market="on_demand", resources={**AWS_ONLY, "providers": ["gcp"], "regions": ["us-central1"]}
    )
    where = {
        **GANG_WHERE,
        "provider": "gcp",
        "region": "us-central1",
        "zone": "us-central1-a",
        "instance_type": "n1-standard-8",
    }
    job.plan = dataclasses.replace(chosen(where, 2 * ON_DEMAND), nodes=2).to_json()
    session.add(job)
    session.commit()
    hands.launch(job.id)
    (attempt,) = _attempts(session, job.id)
    nodes = _nodes(session, attempt.id)
    assert attempt.status == "running" and len(nodes) == 2 and len(set(nodes)) == 2
    refs = [InstanceRef("gcp", "us-central1", "us-central1-a", name) for name in nodes]
    labels = [gcp.describe(ref).tags for ref in refs]
    assert [x["broker-node"] for x in labels] == ["0", "1"]

    gcp.terminate(refs[1])  # one node deleted behind the broker's back
    clock.advance(60)
    hands.observe(attempt.id)

    _fresh(session)
    assert session.get(Attempt, attempt.id).end_reason == "preempted"
    assert {s.status if s else None for s in gcp.describe_many(refs).values()} <= {
        "terminated",
        None,
    }  # node 0 went with it
    assert session.get(Job, job.id).status == "preempted"
