"""The on-demand-only figure is booked as spend is (``broker.core.spend``)."""

from __future__ import annotations

from broker.core.money import cost_micros
from broker.core.planner import Plan
from broker.core.spend import on_demand_only_cost, on_demand_saving, plan_on_demand_only

PRICE = 2_860_000  # $2.86 an hour


def test_start_up_and_work_are_billed_per_second_rounded_up_like_a_booking():
    figure = on_demand_only_cost(PRICE, startup_hours=0.1, work_hours=2.0, min_billed_seconds=60.0)
    assert figure == cost_micros(PRICE, 2.1 * 3600)


def test_a_short_job_pays_the_billing_minimum():
    assert on_demand_only_cost(
        PRICE, startup_hours=0.0, work_hours=0.001, min_billed_seconds=60.0
    ) == cost_micros(PRICE, 60.0)


def _plan(hours: float) -> Plan:
    return Plan(
        offer_index=0,
        provider="gcp",
        region="us-central1",
        zone="us-central1-a",
        instance_type="n1-standard-8",
        gpu="V100",
        gpu_count=1,
        market="on_demand",
        price_per_hour_micros=PRICE,
        expected_hours=hours,
        expected_cost_micros=int(PRICE * hours),
        worst_case_cost_micros=int(PRICE * hours),
        p_deadline=1.0,
    )


def test_a_plans_checkpoint_writes_are_left_out():
    """The planner's 2 h of work with a 50 s write every 30 min: 0.1 + 2 + 4 x 50 / 3600 h."""
    write = 50 / 3600
    plan = _plan(0.1 + 2.0 + 4 * write)
    figure = plan_on_demand_only(
        plan, startup_hours=0.1, interval_hours=0.5, write_hours=write, min_billed_seconds=60.0
    )
    assert figure == cost_micros(PRICE, 2.1 * 3600)
    assert figure < plan.expected_cost_micros


def test_saving_is_shown_once_finished():
    assert on_demand_saving("running", 1_000_000, 400_000) is None
    assert on_demand_saving("succeeded", None, 400_000) is None
    assert on_demand_saving("succeeded", 1_000_000, 1_200_000) == -200_000
