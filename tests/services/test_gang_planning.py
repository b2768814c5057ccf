"""A gang job's money and speed as steering, reservations and the progress bound see them:
whole-gang prices, the gang's speed, re-plans of the same shape."""

from __future__ import annotations

import pytest

from broker.services import lifecycle
from broker.services.agent_reports import top_speed
from broker.services.plans import ChosenPlan
from broker.services.quoting import get_planning
from broker.services.reservations import fallback, finish_on_demand, offer_prices
from broker.services.steering import policy_state
from tests.helpers import LEASE

GANG = {"gpus": 8, "nodes": 2, "gpu_types": ["V100"], "providers": ["aws"]}


@pytest.fixture
def gang_job(session, clock, submit):  # type: ignore[no-untyped-def]
    """A job of 2 machines of 8 V100s, running on its admitted plan."""
    job = submit(resources=GANG, max_cost="900.00")
    plan = ChosenPlan.from_json(job.plan)
    assert (plan.nodes, plan.gpu_count) == (2, 8)
    begun = lifecycle.begin_attempt(session, job.id, plan, clock.now())
    assert begun is not None
    attempt, _ = begun
    lifecycle.launch_succeeded(session, attempt.id, "i-0", clock.now(), lease_seconds=LEASE)
    return job, attempt, plan


def test_the_policy_sees_whole_gang_prices_and_the_gang_s_speed(session, clock, gang_job):
    job, attempt, plan = gang_job
    planning = get_planning()
    assert attempt.nodes == 2 and attempt.price_micros_per_hour == plan.price_per_hour_micros
    state = policy_state(planning, session, job, attempt, clock.now(), 0.1)
    assert state is not None
    listed = offer_prices(
        planning, plan.provider, plan.zone, plan.instance_type, plan.gpu, plan.gpu_count
    )
    assert listed is not None
    spot, on_demand = listed
    paid = plan.price_per_hour_micros / 1e6
    if plan.market == "spot":
        assert (state.spot_price, state.on_demand_price) == (paid, 2 * on_demand / 1e6)
    else:
        assert (state.spot_price, state.on_demand_price) == (2 * spot / 1e6, paid)
    gang_rate = planning.rate(session, job, plan.gpu, plan.gpu_count, nodes=2)
    one_rate = planning.rate(session, job, plan.gpu, plan.gpu_count)
    assert one_rate < gang_rate < 2 * one_rate
    assert state.work_total_hours == pytest.approx(job.total_work / gang_rate)


def test_finishing_on_demand_is_priced_on_a_gang_of_the_same_shape(session, clock, gang_job):
    job, _, _ = gang_job
    planning = get_planning()
    on_demand = fallback(planning, session, job, clock.now())
    assert on_demand is not None and (on_demand.nodes, on_demand.gpu_count) == (2, 8)
    row = planning.offers.row(on_demand.offer_index)
    assert on_demand.price_per_hour_micros == 2 * row.on_demand_micros_per_hour
    finish = finish_on_demand(planning, session, job, clock.now(), 0.1)
    rest = on_demand.expected_hours - planning.startup_hours
    assert finish == pytest.approx(
        on_demand.price_per_hour_micros * (rest + planning.restart_hours(job) + 0.1)
    )


def test_a_gang_may_report_up_to_linear_scaling(session, clock, gang_job):
    job, attempt, plan = gang_job
    planning = get_planning()
    one = planning.rate(session, job, plan.gpu, plan.gpu_count)
    assert top_speed(planning, session, job, attempt) == pytest.approx(2 * one)
