"""Plans as services pass and store them: integer micro-dollars, typed, in ``Job.plan``."""

from __future__ import annotations

from broker.db.models import Job
from broker.services import lifecycle
from broker.services.job_spec import JobSpec
from broker.services.plans import ChosenPlan, job_plan
from broker.services.quoting import get_planning, quote_job
from tests.helpers import job_spec


def test_a_plan_survives_the_json_column_unchanged(clock):
    best = quote_job(JobSpec.model_validate(job_spec()), clock.now()).plans[0]
    plan = ChosenPlan.from_plan(best)
    stored = plan.to_json()
    assert ChosenPlan.from_json(stored) == plan
    for key in ("price_per_hour_micros", "expected_cost_micros", "worst_case_cost_micros"):
        assert type(stored[key]) is int
    assert stored["worst_case_cost_micros"] == best.worst_case_cost_micros


def test_admission_stores_the_best_plan_with_money_as_integers(session, clock, submit):
    job = submit()
    best = quote_job(JobSpec.model_validate(job.spec), clock.now(), session).plans[0]
    stored = session.get(Job, job.id).plan
    assert stored == ChosenPlan.from_plan(best).to_json()
    assert "price_per_hour" not in stored


def test_an_attempt_on_a_chosen_plan_makes_it_the_jobs_plan(session, clock, submit):
    job = submit()
    admitted = job_plan(job)
    other = get_planning().plans_for_job(session, job, clock.now(), market="on_demand").choices[0]
    assert other != admitted
    attempt, _ = lifecycle.begin_attempt(session, job.id, other, clock.now())
    assert job_plan(session.get(Job, job.id)) == other
    assert (attempt.zone, attempt.market) == (other.zone, "on_demand")
    assert attempt.price_micros_per_hour == other.price_per_hour_micros
