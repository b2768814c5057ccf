"""What admission holds: a bound of what the policy may spend, not the planner's worst case."""

from __future__ import annotations

import math
from datetime import timedelta

from sqlmodel import Session

from broker.core.job_status import JobStatus
from broker.core.reservation import RESERVE_FACTOR
from broker.devstack.demo import demo_jobs
from broker.services import admission, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved
from broker.services.plans import job_plan
from broker.services.quoting import get_planning
from broker.services.reservations import hold
from broker.services.teams import create_team


def test_an_auto_job_holds_one_and_a_half_on_demand_runs_as_its_plan_says(session, submit):
    job = submit()
    plan = job_plan(job)
    assert plan is not None and plan.market == "spot"
    held = job_reserved(session, job.id)
    on_demand = job.on_demand_cost_micros
    # the plan's worst case is the same bound (the planner caps spot-then-on-demand by it)
    assert held == math.floor(RESERVE_FACTOR * on_demand) == plan.worst_case_cost_micros


def test_an_on_demand_job_holds_its_cost_and_one_restart(session, submit):
    job = submit(market="on_demand")
    plan = job_plan(job)
    assert plan is not None
    planning = get_planning()
    restore = planning.restart_hours(job) - planning.startup_hours
    held = job_reserved(session, job.id)
    assert (
        plan.worst_case_cost_micros
        <= held
        <= plan.expected_cost_micros + math.ceil(plan.price_per_hour_micros * restore)
    )


def test_a_spot_job_holds_the_planners_worst_case(session, submit):
    job = submit(market="spot")
    plan = job_plan(job)
    assert plan is not None
    assert job_reserved(session, job.id) == min(plan.worst_case_cost_micros, job.max_cost_micros)


def test_every_demo_job_reserves_at_most_one_and_a_half_on_demand_runs(session, clock):
    team = create_team(session, "demo", 10**12, "total", 0.8, clock.now())
    for demo in demo_jobs(clock.now()):
        if demo.expect not in ("accepted", "fails"):
            continue
        job, _ = admission.submit(session, team.id, JobSpec.model_validate(demo.spec), clock.now())
        assert job.on_demand_cost_micros is not None
        held = job_reserved(session, job.id)
        assert held <= RESERVE_FACTOR * job.on_demand_cost_micros, demo.spec["name"]


def test_an_auto_job_planned_on_demand_holds_room_to_move_to_spot(session, submit, clock):
    # 6 h for ~4.4 h of work: the planner keeps no room for a whole spot run, so it plans
    # on-demand; the policy may still take spot, and its budget net needs the auto bound
    job = submit(deadline=(clock.now() + timedelta(hours=6)).isoformat())
    plan = job_plan(job)
    assert plan is not None and plan.market == "on_demand"
    auto_bound = math.floor(RESERVE_FACTOR * plan.expected_cost_micros)
    assert job_reserved(session, job.id) == min(job.max_cost_micros, auto_bound)
    on_demand_job = submit(2_000_000_000, market="on_demand", deadline=job.deadline.isoformat())
    assert job_reserved(session, on_demand_job.id) < job_reserved(session, job.id)


def test_a_job_that_ended_since_its_decision_gets_no_new_hold(session, db_engine, clock, submit):
    # steering decides on a job another worker then ends (its exit booked, its hold given
    # back): the hold the budget net asked for must not be taken for the ended job
    job = submit()
    held = job_reserved(session, job.id)
    session.commit()
    with Session(db_engine) as other:
        lifecycle.stop(other, job.id, JobStatus.CANCELLED, "cancelled elsewhere", clock.now())
        other.commit()
    assert hold(session, job, held + 1_000_000, held + 2_000_000, clock.now()) == 0
    assert job_reserved(session, job.id) == 0
