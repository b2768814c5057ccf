"""The runner against an in-memory cloud: success needs the final checkpoint, and the token a
launch hands its instance survives a retried launch after a restart (issue 21)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select

from broker.db.models import Attempt, Job, SpotModelRow, Team
from broker.services import lifecycle
from broker.services.agent_reports import report_progress
from broker.services.launch_request import agent_token
from broker.services.ledger import job_reserved
from broker.services.quoting import get_planning
from broker.services.runner import WAITING, Runner
from broker.services.steering import MOVE_BACK_HOURS, REFUSED_HOURS, candidate_zones
from broker.services.teams import hash_token
from broker.services.wiring import agent_secret
from broker.settings import Settings
from providers.base import (
    CapacityError,
    InstanceRef,
    InstanceState,
    LaunchRequest,
    TransientError,
)
from providers.boot import script_exports as exported
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen, steady_spot


class Cloud:
    """A cloud in memory: an instance runs from its launch until it is terminated; the same
    launch token finds the same instance. ``fail_next`` makes the next launch a transient
    error (the cloud never saw it)."""

    def __init__(self) -> None:
        self.requests: list[LaunchRequest] = []
        self.terminated: set[str] = set()
        self.fail_next = False

    def launch(self, request: LaunchRequest) -> InstanceRef:
        if self.fail_next:
            self.fail_next = False
            raise TransientError("the cloud did not answer")
        self.requests.append(request)
        return InstanceRef(request.provider, request.region, request.zone, f"i-{request.token}")

    def describe(self, ref: InstanceRef) -> InstanceState:
        gone = ref.instance_id in self.terminated
        return InstanceState("terminated" if gone else "running", None, datetime.now(UTC))

    def terminate(self, ref: InstanceRef) -> None:
        self.terminated.add(ref.instance_id)

    def list_managed(self, region: str) -> list[InstanceRef]:
        return []


class NoSpotCloud(Cloud):
    """A cloud whose every zone refuses spot for capacity."""

    def launch(self, request: LaunchRequest) -> InstanceRef:
        if request.market == "spot" and not self.spot_back:
            self.refused.append(request)
            raise CapacityError("no spot capacity")
        return super().launch(request)

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[LaunchRequest] = []
        self.spot_back = False  # True: spot is to be had again


def runner(engine, cloud: Cloud, secret: str) -> Runner:  # type: ignore[no-untyped-def]
    return Runner(
        engine,
        {"aws": cloud, "gcp": cloud},  # type: ignore[dict-item]
        get_planning(),
        agent_secret=secret,
        api_url="http://broker.invalid",
        tick_seconds=5.0,
    )


def test_full_work_without_a_checkpoint_does_not_succeed_the_job_the_final_checkpoint_does(
    session, db_engine, clock, submit
):
    job = submit(market="spot")
    cloud = Cloud()
    hands = runner(db_engine, cloud, "secret")
    attempt, token = lifecycle.begin_attempt(
        session,
        job.id,
        chosen(SPOT_PLAN, SPOT_PRICE),
        clock.now(),
        token_for=lambda attempt_id: agent_token("secret", attempt_id, job.deadline),
    )
    lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    clock.advance(2 * 3600)  # long enough for all the work to be credible on a V100

    report_progress(session, attempt.id, token, job.total_work, None, clock.now())
    hands.observe(attempt.id)
    session.expire_all()
    job = session.get(Job, job.id)
    assert job.work_done == job.total_work and job.checkpointed_work < job.total_work
    assert job.status == "running", job.status_reason
    assert cloud.terminated == set() and job_reserved(session, job.id) > 0

    final = f"jobs/{job.id}/final"
    report_progress(session, attempt.id, token, job.total_work, final, clock.now())
    hands.observe(attempt.id)
    session.expire_all()
    job = session.get(Job, job.id)
    assert job.status == "succeeded"
    assert cloud.terminated == {"i-1"} and job_reserved(session, job.id) == 0


def test_a_restarted_broker_hands_a_retried_launch_the_token_the_api_accepts(
    session, db_engine, clock, submit, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("BROKER_AGENT_SECRET", raising=False)
    job = submit(market="spot")
    cloud = Cloud()
    cloud.fail_next = True
    before = runner(db_engine, cloud, agent_secret(Settings(data_dir=tmp_path)))
    with pytest.raises(TransientError):
        before.launch(job.id)  # the attempt is recorded, its launch never reached the cloud
    attempt = session.exec(select(Attempt).where(Attempt.job_id == job.id)).one()
    assert attempt.status == "launching"

    # Restart: new settings read the same data folder, a new runner retries the launch.
    after = runner(db_engine, cloud, agent_secret(Settings(data_dir=tmp_path)))
    after.observe(attempt.id)
    handed = exported(cloud.requests[-1].boot_script)
    assert handed["BROKER_ATTEMPT_ID"] == attempt.id
    assert hash_token(handed["BROKER_AGENT_TOKEN"]) == attempt.token_hash
    clock.advance(600)
    session.expire_all()  # the runner changed the job in its own sessions
    token = handed["BROKER_AGENT_TOKEN"]
    done = report_progress(session, attempt.id, token, 10, None, clock.now())
    assert done.status == "running" and done.work_done == 10


def test_the_lease_sweep_renews_leases_about_to_end_and_stops_lapsed_ones(
    session, db_engine, clock, submit
):
    cloud = Cloud()
    hands = runner(db_engine, cloud, "secret")  # 5 s ticks at x1: leases of 600 s
    soon, later, lapsed = (submit(budget=10**9 + n) for n in range(3))
    attempts = {}
    for job, lease in ((soon, 600.0), (later, 3600.0), (lapsed, 60.0)):
        attempt, _ = lifecycle.begin_attempt(
            session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
        )
        lifecycle.launch_succeeded(
            session, attempt.id, f"i-{job.id}", clock.now(), lease_seconds=lease
        )
        attempts[job.id] = attempt.id
    clock.advance(595)  # soon's lease ends within the 10 s renewal window; lapsed's ended

    assert hands.sweep_leases() == 2
    session.expire_all()
    renewed = session.get(Attempt, attempts[soon.id])
    assert (renewed.lease_until - clock.now()).total_seconds() == pytest.approx(600.0)
    untouched = session.get(Attempt, attempts[later.id])
    assert untouched.billed_seconds == 0.0  # not due: left to its observation
    stopped = session.get(Attempt, attempts[lapsed.id])
    assert (stopped.status, stopped.end_reason) == ("ended", "lease")
    assert f"i-{lapsed.id}" in cloud.terminated


def test_a_launch_keeps_to_the_reservation_admission_made(session, db_engine, clock, submit):
    job = submit()
    held = job_reserved(session, job.id)
    team = session.get(Team, job.team_id)
    team.budget_limit_micros = held  # nothing left to top a reservation up from
    session.add(team)
    session.commit()
    assert runner(db_engine, Cloud(), "secret").launch(job.id) is not None
    session.expire_all()
    assert session.get(Job, job.id).status == "running"
    assert job_reserved(session, job.id) == held


def test_an_auto_job_refused_spot_everywhere_waits_asking_for_it_each_tick_while_slack_allows(
    session, db_engine, clock, submit
):
    job = submit()  # 48 h to its deadline
    cloud = NoSpotCloud()
    hands = runner(db_engine, cloud, "secret")
    assert hands.launch(job.id) is None
    assert cloud.refused and not cloud.requests  # spot tried, refused; no on-demand started
    tried = len(cloud.refused)
    clock.advance(600)
    # the next tick: the policy still waits, and asks for spot once, as a request kept open
    assert hands.launch(job.id) is None
    assert len(cloud.refused) == tried + 1 and not cloud.requests
    cloud.spot_back = True
    clock.advance(600)
    assert hands.launch(job.id) is not None  # the tick after spot came back: on spot
    assert [r.market for r in cloud.requests] == ["spot"]
    session.expire_all()
    assert session.get(Job, job.id).status in WAITING  # a later tick asks again


def test_an_auto_job_refused_spot_everywhere_starts_on_demand_when_it_cannot_wait(
    session, db_engine, clock, submit
):
    job = submit(deadline=(clock.now() + timedelta(hours=48)).isoformat())
    work = session.get(Job, job.id)
    plan_hours = get_planning().restart_hours(work) + 4.6  # about the plan's run, then tight
    work.deadline = clock.now() + timedelta(hours=plan_hours)
    session.add(work)
    session.commit()
    cloud = NoSpotCloud()
    assert runner(db_engine, cloud, "secret").launch(job.id) is not None
    assert [r.market for r in cloud.requests] == ["on_demand"]
    session.expire_all()
    assert session.get(Job, job.id).status == "running"


@pytest.mark.parametrize("market", ["wait", "spot"])
def test_an_auto_job_no_spot_plan_can_finish_in_time_starts_on_demand_rather_than_stop(
    session, db_engine, clock, submit, market, fresh_planning
):
    """The policy may still say wait (or spot) when the planner finds no spot plan within the
    job's deadline and budget (``broker demo``'s ``resnet50-tight``, stopped 2 h before its
    deadline with on-demand able to finish in 1.4 h): on-demand, not a stop. An auto job's
    spot plan needs only its on-demand run to fit the deadline (the policy keeps it), so here
    its budget leaves room for the cheapest on-demand plan and for no spot plan's worst case."""
    job = submit(deadline=(clock.now() + timedelta(hours=48)).isoformat())
    work, planning = session.get(Job, job.id), get_planning()
    for tenths in range(30, 200):  # the tightest deadline on-demand alone still meets
        work.deadline = clock.now() + timedelta(hours=tenths / 10)
        on_demand = planning.plans_for_job(session, work, clock.now(), market="on_demand")
        if on_demand.choices:
            break
    work.max_cost_micros = min(c.worst_case_cost_micros for c in on_demand.choices)
    session.add(work)
    session.commit()
    spot = planning.plans_for_job(session, work, clock.now(), market="spot")
    assert spot.stop is not None
    session.commit()  # end the read: what the runner writes is seen below
    cloud = Cloud()
    assert runner(db_engine, cloud, "secret").launch(job.id, market=market) is not None
    assert [r.market for r in cloud.requests] == ["on_demand"]
    session.expire_all()
    assert session.get(Job, job.id).status == "running"


def test_an_on_demand_launch_may_go_where_the_jobs_spot_was_just_preempted(
    session, db_engine, clock, submit
):
    """A zone out of spot may have on-demand: after a preemption there, the job's on-demand
    plan in that zone is not left out (the demo's ``resnet50-tight`` paid $3.67/h for an
    on-demand A100 elsewhere rather than $2.95/h there)."""
    job = submit()
    best = get_planning().plans_for_job(session, job, clock.now(), market="on_demand").choices[0]
    spot, _ = lifecycle.begin_attempt(
        session, job.id, dataclasses.replace(best, market="spot"), clock.now()
    )
    lifecycle.launch_succeeded(session, spot.id, "i-spot", clock.now(), lease_seconds=LEASE)
    clock.advance(600)
    lifecycle.preempted(session, spot.id, clock.now())
    session.commit()
    cloud = Cloud()
    assert runner(db_engine, cloud, "secret").launch(job.id, market="on_demand") is not None
    assert [(r.market, r.zone) for r in cloud.requests] == [("on_demand", best.zone)]


def short_lived_spot(provider: str, zone: str, shape: str, now: datetime) -> SpotModelRow:
    """A spot model whose windows last 3 minutes and outages 6 hours."""
    return SpotModelRow(
        provider=provider,
        zone=zone,
        family=shape,
        up_runs=[0.05] * 100,
        down_runs=[6.0] * 100,
        prior="test",
        preemptions_per_hour=20.0,
        mean_window_hours=0.05,
        mean_outage_hours=6.0,
        fitted_at=now,
    )


def test_a_tick_launches_the_waiting_jobs_least_slack_first(session, db_engine, clock, submit):
    def due_in(hours: float) -> str:
        return (clock.now() + timedelta(hours=hours)).isoformat()

    loose = submit(budget=1_000_000_001, deadline=due_in(96))
    tight = submit(budget=1_000_000_002, deadline=due_in(24))
    middle = submit(budget=1_000_000_003, deadline=due_in(60))
    # Due last of all, with twenty times the work (40,000 steps take about 5 h, these about
    # 60 h): it must start before the middle and the loose ones.
    long = submit(
        budget=1_000_000_004,
        deadline=due_in(100),
        workload={"model": "ResNet-50", "batch_size": 128, "steps": 800_000},
        max_cost="5000.00",
    )
    assert loose.id < tight.id < middle.id < long.id  # submission order is not launch order
    assert tight.start_by < long.start_by < middle.start_by < loose.start_by
    assert runner(db_engine, Cloud(), "secret").due().launch == [
        tight.id,
        long.id,
        middle.id,
        loose.id,
    ]


def test_admissions_launch_of_a_loose_job_starts_a_tighter_waiting_job_first(
    session, db_engine, clock, submit
):
    loose = submit(budget=1_000_000_011, deadline="2027-06-01T12:00:00Z", market="on_demand")
    tight = submit(budget=1_000_000_012, deadline="2027-01-10T12:00:00Z", market="on_demand")
    cloud = Cloud()
    hands = runner(db_engine, cloud, "secret")
    # the launch tasks run in submission order: the loose job's first
    hands.launch_urgent_first(loose.id)
    assert [r.tags["broker-job"] for r in cloud.requests] == [tight.id, loose.id]
    hands.launch_urgent_first(tight.id)  # already running: nothing more
    assert len(cloud.requests) == 2
    later = submit(budget=1_000_000_013, deadline="2027-09-01T12:00:00Z", market="on_demand")
    hands.launch_urgent_first(later.id)  # nothing waiting is due sooner: only itself
    assert [r.tags["broker-job"] for r in cloud.requests] == [tight.id, loose.id, later.id]


def test_a_move_back_to_spot_launches_outside_the_zones_the_policy_ruled_out(
    session, db_engine, clock, submit
):
    steady_spot(session, clock.now())
    zones = candidate_zones(get_planning(), "aws", SPOT_PLAN["instance_type"], "use1-az1")
    # Spot refused 1.5 h ago (past REFUSED_HOURS, within MOVE_BACK_HOURS) in every zone of
    # the shape but the dearest, where another job runs on spot: the policy weighs the
    # others as without spot, and so must the launch (any other zone, or cloud, may do).
    dearest, ruled_out = zones[-1], zones[:-1]
    others = [submit(budget=2_000_000_000 + n) for n in range(3)]
    there, _ = lifecycle.begin_attempt(
        session, others[2].id, chosen({**SPOT_PLAN, "zone": dearest}, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_succeeded(session, there.id, "i-there", clock.now(), lease_seconds=LEASE)
    for i, zone in enumerate(ruled_out):
        plan = chosen({**SPOT_PLAN, "zone": zone}, SPOT_PRICE)
        refused, _ = lifecycle.begin_attempt(session, others[i % 2].id, plan, clock.now())
        lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    clock.advance(int(3600 * (REFUSED_HOURS + 0.5)))
    assert REFUSED_HOURS + 0.5 < MOVE_BACK_HOURS

    job = submit()
    cloud = Cloud()
    hands = runner(db_engine, cloud, "secret")
    od, token = lifecycle.begin_attempt(
        session,
        job.id,
        chosen({**SPOT_PLAN, "market": "on_demand"}, 3_060_000),
        clock.now(),
        token_for=lambda attempt_id: agent_token("secret", attempt_id, job.deadline),
    )
    lifecycle.launch_succeeded(session, od.id, "i-od", clock.now(), lease_seconds=LEASE)
    clock.advance(900)
    report_progress(session, od.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now())
    hands.observe(od.id)

    session.expire_all()
    assert session.get(Attempt, od.id).status == "ended" and cloud.terminated == {"i-od"}
    moved = session.exec(select(Attempt).where(Attempt.job_id == job.id, Attempt.id != od.id)).one()
    assert moved.market == "spot" and moved.zone not in ruled_out


def test_a_move_back_to_spot_ends_on_demand_only_once_spot_runs_a_refusal_loses_nothing(
    session, db_engine, clock, submit
):
    """Make before break, as the simulator moves: the on-demand instance keeps running while
    spot is asked for, and ends when a spot instance runs. Before, it was ended first, and
    a refused spot launch cost a new on-demand start and the work since the checkpoint."""
    steady_spot(session, clock.now())
    job = submit()
    cloud = NoSpotCloud()
    hands = runner(db_engine, cloud, "secret")
    od, token = lifecycle.begin_attempt(
        session,
        job.id,
        chosen({**SPOT_PLAN, "market": "on_demand"}, 3_060_000),
        clock.now(),
        token_for=lambda attempt_id: agent_token("secret", attempt_id, job.deadline),
    )
    lifecycle.launch_succeeded(session, od.id, "i-od", clock.now(), lease_seconds=LEASE)
    clock.advance(900)
    report_progress(session, od.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now())
    hands.observe(od.id)

    session.expire_all()
    assert cloud.refused, "the policy moved back to spot: its launch was asked for"
    assert session.get(Attempt, od.id).status == "running" and cloud.terminated == set()
    job = session.get(Job, job.id)
    assert job.status == "running" and job.plan["market"] == "on_demand"
    attempts = session.exec(select(Attempt).where(Attempt.job_id == job.id)).all()
    assert {a.end_reason for a in attempts if a.id != od.id} == {"capacity"}


def test_a_move_back_to_spot_ends_on_demand_when_spot_runs_the_job_on_the_spot_plan(
    session, db_engine, clock, submit
):
    steady_spot(session, clock.now())
    job = submit()
    cloud = Cloud()
    hands = runner(db_engine, cloud, "secret")
    od, token = lifecycle.begin_attempt(
        session,
        job.id,
        chosen({**SPOT_PLAN, "market": "on_demand"}, 3_060_000),
        clock.now(),
        token_for=lambda attempt_id: agent_token("secret", attempt_id, job.deadline),
    )
    lifecycle.launch_succeeded(session, od.id, "i-od", clock.now(), lease_seconds=LEASE)
    clock.advance(900)
    report_progress(session, od.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now())
    report_progress(session, od.id, token, 60, None, clock.now())  # past the checkpoint
    hands.observe(od.id)

    session.expire_all()
    ended = session.get(Attempt, od.id)
    assert ended.status == "ended" and ended.end_reason == "migrated"
    assert cloud.terminated == {"i-od"} and [r.market for r in cloud.requests] == ["spot"]
    moved = session.exec(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.status == "running")
    ).one()
    job = session.get(Job, job.id)
    assert moved.market == "spot" and job.plan["market"] == "spot" and job.status == "running"
    assert moved.started_at == ended.ended_at  # the job is never without an instance
    assert moved.work_at_start == job.work_done == job.checkpointed_work == 50


def test_admissions_batched_launches_go_on_past_a_transient_error(
    session, db_engine, clock, submit
):
    first = submit(budget=1_000_000_021, market="on_demand")
    second = submit(budget=1_000_000_022, market="on_demand")
    cloud = Cloud()
    cloud.fail_next = True  # the first job's launch: the cloud did not answer
    hands = runner(db_engine, cloud, "secret")
    assert hands.launch_admitted([first.id, second.id]) == [first.id]
    assert [r.tags["broker-job"] for r in cloud.requests] == [second.id]
    assert hands.launch_admitted([first.id]) == []  # its retry: the same attempt, launched
    assert [r.tags["broker-job"] for r in cloud.requests] == [second.id, first.id]


def test_the_ticks_batched_launches_go_in_its_order_past_a_transient_error(
    session, db_engine, clock, submit
):
    jobs = [submit(budget=1_000_000_031 + n, market="on_demand") for n in range(3)]
    cloud = Cloud()
    cloud.fail_next = True  # the first job's launch: the cloud did not answer
    hands = runner(db_engine, cloud, "secret")
    due = [job.id for job in jobs]
    assert hands.due().launch == due  # equal slack: by id
    assert hands.launch_due(due) == [jobs[0].id]
    assert [r.tags["broker-job"] for r in cloud.requests] == due[1:]
    # its attempt waits in ``launching``: the next tick observes it, which finishes the
    # launch (as a launch of the job would)
    assert len(hands.due().observe) == 3 and hands.due().launch == []
    assert hands.launch_due([jobs[0].id]) == []
    assert [r.tags["broker-job"] for r in cloud.requests] == [*due[1:], jobs[0].id]
