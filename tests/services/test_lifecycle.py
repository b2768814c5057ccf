"""Lifecycle transitions on a real database: attempts, spend, preemption, stops."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from broker.core.errors import BudgetExceeded, Conflict, IllegalTransition, NotFound
from broker.core.job_status import JobStatus
from broker.core.money import cost_micros
from broker.db.models import Attempt, Job, LedgerEntry
from broker.services import admission, agent_reports, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved, job_spent
from broker.services.quoting import quote_job
from broker.services.teams import create_team
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen, job_spec


@pytest.fixture
def job(session, clock):
    team = create_team(session, "t", 1_000_000_000, "month", 0.8, clock.now())
    spec = JobSpec.model_validate(job_spec(max_cost="20.00"))
    created, _ = admission.submit(session, team.id, spec, clock.now())
    return created


def _running(session, job, clock):
    attempt, token = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_succeeded(session, attempt.id, "i-123", clock.now(), lease_seconds=LEASE)
    return attempt, token


def test_a_launch_finishing_an_attempt_another_worker_began_sees_the_job_as_it_is_now(
    session, job, clock, db_engine
):
    # this worker read the job while it was queued (``Runner.launch`` reads it first) ...
    assert session.get(Job, job.id).status == JobStatus.QUEUED
    session.commit()
    # ... another worker began an attempt meanwhile (job -> provisioning) ...
    with Session(db_engine, expire_on_commit=False) as other:
        attempt, _ = lifecycle.begin_attempt(
            other, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
        )
    # ... and this one, finding it launching, finishes its launch: on the job's current row
    assert (
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        == []
    )
    assert session.get(Job, job.id).status == JobStatus.RUNNING


def test_attempt_runs_and_books_per_second_spend(session, job, clock):
    held = job_reserved(session, job.id)
    attempt, _ = _running(session, job, clock)
    assert session.get(Job, job.id).status == "running"
    clock.advance(30)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
    assert job_spent(session, job.id) == 15_300  # the 60 s minimum: 0.918 * 60 / 3600
    clock.advance(3570)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
    assert job_spent(session, job.id) == SPOT_PRICE  # exactly one hour
    assert job_reserved(session, job.id) == max(held - SPOT_PRICE, 0)


def test_ledger_equals_billed_seconds_times_price(session, job, clock):
    attempt, _ = _running(session, job, clock)
    for step in (100, 250, 7, 1000):
        clock.advance(step)
        lifecycle.accrue(
            session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE
        )
    ended = lifecycle.stop(session, job.id, JobStatus.SUCCEEDED, "work reached", clock.now())
    assert [t.instance_id for t in ended] == ["i-123"]
    attempt = session.get(Attempt, attempt.id)
    assert attempt.billed_seconds == 1357
    assert job_spent(session, job.id) == -(-SPOT_PRICE * 1357 // 3600)
    assert job_reserved(session, job.id) == 0


def test_an_end_read_from_an_earlier_clock_keeps_the_ledger_exact(session, job, clock):
    attempt, _ = _running(session, job, clock)
    began = clock.now()
    clock.advance(1000)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
    # another worker read the clock 100 s earlier and ends the attempt after that booking
    lifecycle.stop(
        session, job.id, JobStatus.SUCCEEDED, "work reached", began + timedelta(seconds=900)
    )
    attempt = session.get(Attempt, attempt.id)
    assert attempt.billed_seconds == 1000
    assert attempt.cost_micros == cost_micros(attempt.price_micros_per_hour, 1000)
    assert job_spent(session, job.id) == attempt.cost_micros
    # it ended where its booking did, not before: its run is the time billed
    assert attempt.ended_at == began + timedelta(seconds=1000)


def test_an_end_after_another_workers_later_booking_ends_where_that_booking_does(
    session, job, clock, db_engine
):
    attempt, _ = _running(session, job, clock)
    began = clock.now()
    clock.advance(900)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
    # this worker holds the attempt as booked to 900 s; another books it to 1000 s meanwhile
    with Session(db_engine, expire_on_commit=False) as other:
        lifecycle.accrue(
            other,
            attempt.id,
            began + timedelta(seconds=1000),
            lookahead_seconds=60,
            lease_seconds=LEASE,
        )
    lifecycle.stop(session, job.id, JobStatus.SUCCEEDED, "work reached", clock.now())
    session.expire_all()
    ended = session.get(Attempt, attempt.id)
    assert ended.billed_seconds == 1000
    assert ended.ended_at == began + timedelta(seconds=1000)  # its run is the time billed


def test_an_end_within_the_minimum_billed_time_is_when_it_was_asked(session, job, clock):
    attempt, _ = _running(session, job, clock)
    began = clock.now()
    clock.advance(20)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE)
    lifecycle.migrate(session, attempt.id, "test", clock.now())
    attempt = session.get(Attempt, attempt.id)
    assert attempt.billed_seconds == 60  # the minimum: it says nothing of when the run ended
    assert attempt.ended_at == began + timedelta(seconds=20)


def test_preemption_falls_back_to_latest_checkpoint(session, job, clock):
    attempt, token = _running(session, job, clock)
    agent_reports.record_progress(
        session, attempt.id, token, 1000, f"jobs/{job.id}/ckpt-1000", clock.now()
    )
    agent_reports.record_progress(session, attempt.id, token, 1500, None, clock.now())
    lifecycle.preempted(session, attempt.id, clock.now())
    reloaded = session.get(Job, job.id)
    assert reloaded.status == "preempted"
    assert reloaded.work_done == 1000 and reloaded.checkpointed_work == 1000
    assert agent_reports.latest_checkpoint(session, job.id).object_key == f"jobs/{job.id}/ckpt-1000"
    second, _ = lifecycle.begin_attempt(
        session, job.id, chosen({**SPOT_PLAN, "zone": "use1-az2"}, SPOT_PRICE), clock.now()
    )
    assert second.work_at_start == 1000


def test_progress_with_wrong_token_is_not_found(session, job, clock):
    attempt, _ = _running(session, job, clock)
    with pytest.raises(NotFound):
        agent_reports.record_progress(session, attempt.id, "att_wrong", 10, None, clock.now())


def test_progress_after_end_is_conflict(session, job, clock):
    attempt, token = _running(session, job, clock)
    lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    with pytest.raises(Conflict):
        agent_reports.record_progress(session, attempt.id, token, 10, None, clock.now())


def test_budget_exhausted_stops_before_overspending(session, job, clock):
    attempt, _ = _running(session, job, clock)
    now = clock.now()
    stopped = []
    while not stopped:
        now += timedelta(minutes=10)
        stopped = lifecycle.accrue(
            session, attempt.id, now, lookahead_seconds=600, lease_seconds=LEASE
        )
    reloaded = session.get(Job, job.id)
    assert reloaded.status == "budget_exhausted"
    assert job_spent(session, job.id) <= 20_000_000
    assert job_reserved(session, job.id) == 0


def _refused(session, job, clock, plan, times):  # type: ignore[no-untyped-def]
    for _ in range(times):
        attempt, _ = lifecycle.begin_attempt(session, job.id, chosen(plan, SPOT_PRICE), clock.now())
        lifecycle.launch_failed(session, attempt.id, "capacity", clock.now())


def test_capacity_failures_in_a_row_fail_the_job(session, clock):
    team = create_team(session, "s", 1_000_000_000, "month", 0.8, clock.now())
    spec = JobSpec.model_validate(job_spec(max_cost="20.00", market="spot"))
    job, _ = admission.submit(session, team.id, spec, clock.now())
    _refused(session, job, clock, SPOT_PLAN, lifecycle.MAX_LAUNCH_FAILURES)
    reloaded = session.get(Job, job.id)
    assert reloaded.status == "failed"
    assert job_spent(session, job.id) == 0 and job_reserved(session, job.id) == 0


def test_an_auto_jobs_spot_refusals_are_not_failures_its_on_demand_ones_are(session, job, clock):
    # its policy waits for spot or takes on-demand in time: spot capacity is no failure
    _refused(session, job, clock, SPOT_PLAN, lifecycle.MAX_LAUNCH_FAILURES + 2)
    assert session.get(Job, job.id).status != "failed"
    on_demand = {**SPOT_PLAN, "market": "on_demand"}
    _refused(session, job, clock, on_demand, lifecycle.MAX_LAUNCH_FAILURES - 1)
    assert session.get(Job, job.id).status != "failed"
    _refused(session, job, clock, SPOT_PLAN, 1)  # in between: neither counts nor breaks the run
    _refused(session, job, clock, on_demand, 1)
    assert session.get(Job, job.id).status == "failed"


def test_second_live_attempt_is_refused(session, job, clock):
    _running(session, job, clock)
    assert (
        lifecycle.begin_attempt(session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()) is None
    )


def test_launch_finishing_after_cancel_hands_back_instance(session, job, clock):
    attempt, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    ended = lifecycle.launch_succeeded(
        session, attempt.id, "i-late", clock.now(), lease_seconds=LEASE
    )
    assert [t.instance_id for t in ended] == ["i-late"]


def test_migration_returns_to_provisioning(session, job, clock):
    attempt, _ = _running(session, job, clock)
    clock.advance(120)
    ended = lifecycle.migrate(session, attempt.id, "deadline close: on-demand", clock.now())
    assert [t.instance_id for t in ended] == ["i-123"]
    assert session.get(Job, job.id).status == "provisioning"


def test_a_replacing_attempt_leaves_the_running_one_be_until_it_runs_itself(session, job, clock):
    od_plan = chosen({**SPOT_PLAN, "market": "on_demand"}, 3_060_000)
    od, _ = lifecycle.begin_attempt(session, job.id, od_plan, clock.now())
    lifecycle.launch_succeeded(session, od.id, "i-od", clock.now(), lease_seconds=LEASE)
    clock.advance(600)
    spot, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now(), replacing=od.id
    )
    job = session.get(Job, job.id)
    assert job.status == "running" and job.plan["market"] == "on_demand"
    # one replacement at a time, and no plain launch beside them
    again = chosen(SPOT_PLAN, SPOT_PRICE)
    assert lifecycle.begin_attempt(session, job.id, again, clock.now(), replacing=od.id) is None
    assert lifecycle.begin_attempt(session, job.id, again, clock.now()) is None

    clock.advance(30)
    ended = lifecycle.launch_succeeded(
        session, spot.id, "i-spot", clock.now(), lease_seconds=LEASE, plan=again
    )
    assert [t.instance_id for t in ended] == ["i-od"]
    session.expire_all()
    od, job = session.get(Attempt, od.id), session.get(Job, job.id)
    assert (od.status, od.end_reason, od.ended_at) == ("ended", "migrated", clock.now())
    assert job.status == "running" and job.plan["market"] == "spot"
    # the on-demand instance is billed to the instant the spot one took over
    assert od.billed_seconds == 630 and od.cost_micros == cost_micros(3_060_000, 630)


def test_a_replacing_launch_whose_running_attempt_was_lost_meanwhile_runs_the_job(
    session, job, clock
):
    od_plan = chosen({**SPOT_PLAN, "market": "on_demand"}, 3_060_000)
    od, _ = lifecycle.begin_attempt(session, job.id, od_plan, clock.now())
    lifecycle.launch_succeeded(session, od.id, "i-od", clock.now(), lease_seconds=LEASE)
    spot, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now(), replacing=od.id
    )
    lifecycle.lost(session, od.id, clock.now(), "agent silent")
    assert session.get(Job, job.id).status == "preempted"
    assert (
        lifecycle.launch_succeeded(session, spot.id, "i-spot", clock.now(), lease_seconds=LEASE)
        == []
    )
    session.expire_all()
    assert session.get(Job, job.id).status == "running"
    assert session.get(Attempt, spot.id).status == "running"


def test_finished_job_cannot_be_stopped_again(session, job, clock):
    lifecycle.stop(session, job.id, JobStatus.DEADLINE_MISSED, "late", clock.now())
    assert lifecycle.stop(session, job.id, JobStatus.FAILED, "x", clock.now()) == []
    with pytest.raises(IllegalTransition):
        lifecycle.cancel(session, job.team_id, job.id, clock.now())
    kinds = [e.kind for e in session.exec(select(LedgerEntry).order_by(LedgerEntry.id)).all()]
    assert kinds == ["reserve", "release"]


def test_spend_passing_the_alert_threshold_logs_one_warning(session, clock, caplog):
    team = create_team(session, "alerted", 300_000_000, "month", 0.1, clock.now())  # $300, 10 %
    spec = JobSpec.model_validate(job_spec(max_cost="250.00"))
    job, _ = admission.submit(session, team.id, spec, clock.now())
    attempt, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, 10_000_000), clock.now()
    )  # $10/h
    lifecycle.launch_succeeded(session, attempt.id, "i-9", clock.now(), lease_seconds=LEASE)
    caplog.set_level("WARNING", logger="broker.services.billing")
    for _ in range(6):  # $10 per step: the $30 threshold is crossed at the third
        clock.advance(3600)
        lifecycle.accrue(
            session, attempt.id, clock.now(), lookahead_seconds=60, lease_seconds=LEASE
        )
    warnings = [r for r in caplog.records if "budget alert" in r.getMessage()]
    assert len(warnings) == 1
    assert "30.00 of 300.00 USD spent" in warnings[0].getMessage()


def test_a_repeated_launch_of_the_same_attempt_keeps_it_running(session, job, clock):
    # Two workers finishing the same interrupted launch: the token found the same instance.
    attempt, _ = lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    assert (
        lifecycle.launch_succeeded(session, attempt.id, "i-7", clock.now(), lease_seconds=LEASE)
        == []
    )
    assert (
        lifecycle.launch_succeeded(session, attempt.id, "i-7", clock.now(), lease_seconds=LEASE)
        == []
    )
    again = session.get(Attempt, attempt.id)
    session.refresh(again)
    assert again.status == "running" and again.end_reason is None
    assert session.get(Job, job.id).status == "running"


def test_a_job_whose_checkpoint_holds_all_work_succeeds_from_provisioning(session, job, clock):
    # Migrated to on-demand right after its final checkpoint: nothing is left to launch.
    attempt, token = _running(session, job, clock)
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work, f"jobs/{job.id}/final", clock.now()
    )
    lifecycle.migrate(session, attempt.id, "deadline close", clock.now())
    assert session.get(Job, job.id).status == "provisioning"
    lifecycle.stop(session, job.id, JobStatus.SUCCEEDED, "work reached (checkpointed)", clock.now())
    assert session.get(Job, job.id).status == "succeeded"
    assert job_reserved(session, job.id) == 0


def test_checkpoint_holding_all_work_before_preemption_succeeds(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(600)
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work, f"jobs/{job.id}/final", clock.now()
    )
    lifecycle.preempted(session, attempt.id, clock.now())
    assert session.get(Job, job.id).status == "succeeded"
    assert job_reserved(session, job.id) == 0


def test_relaunch_tops_up_the_reservation_to_the_new_plans_worst_case(session, clock, submit):
    job = submit()
    held = job_reserved(session, job.id)
    lifecycle.begin_attempt(
        session, job.id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now(), reserve_up_to=held + 1_000_000
    )
    assert job_reserved(session, job.id) == held + 1_000_000


def test_top_up_beyond_the_team_budget_is_refused(session, clock, submit):
    spec = job_spec(max_cost="250.00")
    team_budget = (
        quote_job(JobSpec.model_validate(spec), clock.now()).plans[0].worst_case_cost_micros
    )
    job = submit(budget=team_budget, max_cost="250.00")
    with pytest.raises(BudgetExceeded):
        lifecycle.begin_attempt(
            session,
            job.id,
            chosen(SPOT_PLAN, SPOT_PRICE),
            clock.now(),
            reserve_up_to=team_budget * 2,
        )
    assert session.get(Job, job.id).status == "queued"


def test_a_gangs_ended_attempt_names_every_node_and_a_node_launched_late_is_handed_back(
    session, job, clock
):
    gang = dataclasses.replace(chosen(SPOT_PLAN, 3 * SPOT_PRICE), nodes=3)
    attempt, _ = lifecycle.begin_attempt(session, job.id, gang, clock.now())
    for rank in range(2):
        assert lifecycle.node_launched(session, attempt.id, rank, f"i-n{rank}", clock.now()) == []
    # the same node again (a retried launch found the same instance): nothing changes
    assert lifecycle.node_launched(session, attempt.id, 1, "i-n1", clock.now()) == []

    ended = lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    assert [t.instance_id for t in ended] == ["i-n0", "i-n1"]  # every node started so far
    late = lifecycle.node_launched(session, attempt.id, 2, "i-n2", clock.now())
    assert [t.instance_id for t in late] == ["i-n2"]  # the launch under way: its node goes too
    handed = lifecycle.launch_succeeded(
        session, attempt.id, "i-n0", clock.now(), lease_seconds=LEASE
    )
    assert sorted(t.instance_id for t in handed) == ["i-n0", "i-n1", "i-n2"]
