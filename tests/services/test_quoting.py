"""Quotes and re-plans for running jobs on a real database."""

from __future__ import annotations

from datetime import timedelta

from broker.db.models import Job
from broker.services import admission, agent_reports, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.ledger import job_reserved, team_budget
from broker.services.plans import ChosenPlan
from broker.services.quoting import Planning, get_planning, quote_job
from broker.services.quoting import job_spec as job_spec_of
from broker.services.teams import create_team
from tests.helpers import LEASE, job_spec


def test_replan_covers_only_the_work_left_after_the_latest_checkpoint(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    full = planning.plans_for_job(session, job, clock.now())
    attempt, token = run_spot(job)
    clock.advance(3600)
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work * 0.75, f"jobs/{job.id}/k", clock.now()
    )
    lifecycle.preempted(session, attempt.id, clock.now())
    job = session.get(Job, job.id)
    rest = planning.plans_for_job(session, job, clock.now())
    assert full.choices and rest.choices
    best_full, best_rest = full.choices[0], rest.choices[0]
    assert best_rest.expected_hours < best_full.expected_hours


def test_replan_leaves_out_excluded_zones(session, clock, submit):
    job = submit()
    planning = get_planning()
    best = planning.plans_for_job(session, job, clock.now()).choices[0]
    other = planning.plans_for_job(session, job, clock.now(), exclude_zones={best.zone})
    assert other.choices
    assert all(c.zone != best.zone for c in other.choices)


def test_replan_with_no_budget_left_says_budget_exhausted(session, clock, submit, run_spot):
    job = submit(max_cost="250.00")
    attempt, _ = run_spot(job, price=100_000_000)  # $100/h
    # Run until the spend has eaten all but a cent of max_cost.
    clock.advance(3600 * 249.99 / 100)
    lifecycle.accrue(session, attempt.id, clock.now(), lookahead_seconds=0, lease_seconds=LEASE)
    assert session.get(Job, job.id).status == "running"
    lifecycle.preempted(session, attempt.id, clock.now())
    replan = get_planning().plans_for_job(session, session.get(Job, job.id), clock.now())
    assert replan.stop == "budget_exhausted" and not replan.choices


def test_replan_that_cannot_make_the_deadline_says_deadline_missed(session, clock, submit):
    job = submit()
    clock.set(job.deadline - timedelta(minutes=5))
    replan = get_planning().plans_for_job(session, job, clock.now())
    assert replan.stop == "deadline_missed"
    assert "earliest possible finish" in (replan.reason or "")


def test_admission_quotes_one_plan_the_same_best_and_cheapest_on_demand(session, clock):
    for market in ("auto", "spot", "on_demand"):
        spec = JobSpec.model_validate(job_spec(market=market))
        full = quote_job(spec, clock.now(), session)
        one = quote_job(spec, clock.now(), session, top_n=1)
        assert len(full.plans) > 1 and len(one.plans) == 1
        assert one.plans[0] == full.plans[0]
        assert one.cheapest_on_demand == full.cheapest_on_demand


def test_cached_rates_rank_as_a_fresh_planning_does_and_follow_corrections(session, clock):
    planning = get_planning()
    spec = JobSpec.model_validate(job_spec())
    first = planning.quote(spec, clock.now())
    again = planning.quote(spec, clock.now())
    fresh = Planning(planning.offers, planning.model, settings=planning.settings)
    assert first == again == fresh.quote(spec, clock.now())
    slow = {("ResNet-50", "V100"): 0.5}
    corrected = planning.quote(spec, clock.now(), learnt=slow)
    assert corrected == fresh.quote(spec, clock.now(), learnt=slow)
    v100 = [p.expected_hours for p in first.plans if p.gpu == "V100"]
    v100_slow = [p.expected_hours for p in corrected.plans if p.gpu == "V100"]
    assert min(v100_slow) > min(v100) * 1.5
    assert planning.quote(spec, clock.now()) == first  # the uncorrected rates again


def test_admit_returns_what_it_reserved_and_a_replay_reserves_nothing(session, clock):
    team = create_team(session, "admit", 1_000_000_000, "month", 0.8, clock.now())
    spec = JobSpec.model_validate(job_spec())
    admitted = admission.admit(session, team.id, spec, clock.now(), idempotency_key="k1")
    assert admitted.created and admitted.reserved > 0
    assert admitted.reserved == job_reserved(session, admitted.job.id)
    replay = admission.admit(session, team.id, spec, clock.now(), idempotency_key="k1")
    assert not replay.created and replay.job.id == admitted.job.id and replay.reserved == 0
    assert team_budget(session, team, clock.now()).reserved == admitted.reserved


# Gangs --------------------------------------------------------------------------------------


def test_a_quote_for_32_gpus_ranks_gangs_of_identical_machines_each_in_one_zone(session, clock):
    planning = get_planning()
    offers = planning.offers
    spec = JobSpec.model_validate(job_spec(resources={"gpus": 32, "gpu_types": ["H100"]}))
    result = quote_job(spec, clock.now(), session)
    assert result.plans
    keys = [(p.expected_cost_micros, p.expected_hours) for p in result.plans]
    assert keys == sorted(keys)
    for p in result.plans:
        assert (p.nodes, p.gpu_count, p.gpu) == (4, 8, "H100")
        row = offers.row(p.offer_index)  # one offer row: one instance type in one zone
        assert (row.zone, row.instance_type) == (p.zone, p.instance_type)
        each = row.spot_micros_per_hour if p.market == "spot" else row.on_demand_micros_per_hour
        assert p.price_per_hour_micros == 4 * each
    # Any GPU: every split of 32 GPUs into up to 16 identical machines competes.
    anything = quote_job(JobSpec.model_validate(job_spec(resources={"gpus": 32})), clock.now())
    shapes = {(p.nodes, p.gpu_count) for p in anything.plans}
    assert shapes and all(n * g == 32 and 2 <= n <= 16 for n, g in shapes)


def test_a_gang_job_re_plans_on_its_own_shape(session, clock, submit):
    job = submit(resources={"gpus": 32}, max_cost="900.00")
    plan = ChosenPlan.from_json(job.plan)
    assert plan.nodes > 1 and plan.nodes * plan.gpu_count == 32
    planning = get_planning()
    free = planning.quote(JobSpec.model_validate(job.spec), clock.now(), top_n=200)
    assert {(p.nodes, p.gpu_count) for p in free.plans} != {(plan.nodes, plan.gpu_count)}
    replan = planning.plans_for_job(session, job, clock.now(), market="on_demand")
    assert replan.choices
    assert {(c.nodes, c.gpu_count) for c in replan.choices} == {(plan.nodes, plan.gpu_count)}
    assert job_spec_of(job).resources.nodes == plan.nodes
