"""The spot model's pure parts: families, the runs a model keeps, and the planner's rate read
off the very chain the policy plans on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from broker.core.offers import Offer, OfferTable
from broker.core.policy import AvailabilityHistory, PolicyState, history_of, plan_for
from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import plan_step_hours, solve_hours
from broker.core.spot_model import (
    RISK_STEP_HOURS,
    attempt_sightings,
    chain_stats,
    combine,
    families,
    family,
    prior_sample,
    spot_stats,
    zone_chain,
    zone_history,
)

RNG = np.random.default_rng(7)
# Heavy-tailed windows (many short, a few long) and outages, in hours, as the traces have.
UP = tuple(float(x) for x in np.round(RNG.lognormal(-0.5, 1.3, 300), 3))
DOWN = tuple(float(x) for x in np.round(RNG.lognormal(-0.2, 1.0, 300), 3))


@pytest.mark.parametrize(
    ("provider", "instance_type", "gpu", "expected"),
    [
        ("aws", "p3.2xlarge", "V100", "p3"),
        ("aws", "p3dn.24xlarge", "V100-32GB", "p3dn"),
        ("aws", "g5.xlarge", "A10G", "g5"),
        ("gcp", "a2-highgpu-1g", "A100", "a2"),
        ("gcp", "g2-standard-8", "L4", "g2"),
        ("gcp", "n1-standard-8", "T4", "n1-T4"),
        ("gcp", "n1-highmem-16", "V100", "n1-V100"),
    ],
)
def test_family_of_an_offer(provider: str, instance_type: str, gpu: str, expected: str) -> None:
    assert family(provider, instance_type, gpu) == expected


def test_families_of_a_table_match_family_row_by_row() -> None:
    shapes = [
        ("aws", "p3.2xlarge", "V100"),
        ("gcp", "n1-standard-8", "T4"),
        ("aws", "g5.xlarge", "A10G"),
    ]
    offers = OfferTable.from_offers(
        [
            Offer(p, "r", f"z{i}", t, g, 1, 16.0, 8.0, 61.0, 3_060_000, 918_000, 0.0)
            for i, (p, t, g) in enumerate(shapes * 2)
        ]
    )
    assert families(offers).tolist() == ["p3", "n1-T4", "g5"] * 2


def test_prior_sample_keeps_the_shape_of_the_runs_with_fewer_of_them() -> None:
    sample = prior_sample(UP, 50)
    assert len(sample) == 50 and list(sample) == sorted(sample)
    assert np.median(sample) == pytest.approx(np.median(UP), rel=0.1)
    assert np.mean(sample) == pytest.approx(np.mean(UP), rel=0.2)
    assert prior_sample([3.0, 1.0], 50) == (1.0, 3.0)


def test_zone_history_totals_are_those_observe_builds() -> None:
    seen = AvailabilityHistory()
    for available, hours in [(True, 2.0), (False, 0.5), (True, 1.0), (False, 0.3), (True, 0.7)]:
        seen = seen.observe("z", available, hours)
    built = seen.zones["z"]
    assert zone_history(built.up_runs, built.down_runs, True, 0.7) == built


def test_history_of_builds_what_observe_builds_one_by_one() -> None:
    rng = np.random.default_rng(3)
    seen = [
        (
            str(rng.choice(["a", "b", "c"])),
            bool(rng.random() < 0.6),
            float(rng.choice([0.0, 0.1, 1.5])),
        )
        for _ in range(400)
    ]
    one_by_one = AvailabilityHistory()
    for zone, available, hours in seen:
        one_by_one = one_by_one.observe(zone, available, hours)
    assert history_of(seen) == one_by_one
    assert history_of([]) == AvailabilityHistory()


def test_an_attempt_is_seen_as_a_window_a_preemption_ends_or_a_refusal() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(hours=2)
    assert attempt_sightings("z", "capacity", None, None, end) == (("z", False, 0.1),)
    assert attempt_sightings("z", None, None, None, end) == ()
    assert attempt_sightings("z", None, start, None, end) == (("z", True, 2.0),)
    assert attempt_sightings("z", "preempted", start, end, end, nodes=3) == (
        ("z", True, 6.0),
        ("z", False, 0.0),
    )


def test_combine_puts_observations_after_the_prior_and_keeps_the_newest() -> None:
    observed = zone_history((5.0, 6.0), (0.1,), last_available=True, age_hours=2.0)
    model = combine((1.0, 2.0, 3.0), (0.5, 0.6), observed, cap=4)
    assert model.up_runs == (2.0, 3.0, 5.0, 6.0)
    assert model.down_runs == (0.5, 0.6, 0.1)
    assert (model.last_available, model.age_hours) == (True, 2.0)


def test_the_rate_is_what_the_chain_does_in_the_long_run() -> None:
    """One over the chain's mean window equals its stationary flux from available to not,
    per available hour."""
    chain = zone_chain(zone_history(UP, DOWN))
    a = len(chain.edges)
    values, vectors = np.linalg.eig(chain.matrix.T)
    stationary = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    stationary /= stationary.sum()
    up = np.arange(a, 2 * a)
    flux = (stationary[up] * chain.matrix[up, 0]).sum()  # into (unavailable, first bucket)
    per_available_hour = flux / stationary[up].sum() / chain.step_hours
    assert chain_stats(chain).preemptions_per_hour == pytest.approx(per_available_hour, rel=1e-9)


def test_the_rate_is_the_traces_preemptions_per_available_hour_when_runs_are_whole_steps() -> None:
    """The old trace reading (preemptions / available hours) and the chain's agree once runs
    are whole steps and plentiful."""
    steps = RNG.geometric(0.3, 5000) * RISK_STEP_HOURS
    stats = spot_stats(zone_history(steps, steps))
    assert stats.preemptions_per_hour == pytest.approx(len(steps) / steps.sum(), rel=0.02)
    assert stats.mean_window_hours == pytest.approx(steps.mean(), rel=0.02)


def test_the_policy_plans_a_one_zone_job_on_the_chain_the_planner_rates() -> None:
    """``plan_for`` on a history of one zone solves on ``zone_chain``: the planner's rate for
    that zone's offer comes from the chain the policy's decisions come from."""
    seen = zone_history(UP[:120], DOWN[:120], last_available=True, age_hours=0.4)
    state = PolicyState(
        hours_to_deadline=12.0,
        hours_total=12.0,
        work_left_hours=8.0,
        work_total_hours=8.0,
        restart_hours=0.2,
        tick_hours=0.1,
        zones=("use1-az6",),
        spot_obtainable=(True,),
        spot_price=0.92,
        on_demand_price=3.06,
        history=AvailabilityHistory({"use1-az6": seen}),
    )
    assert plan_step_hours(state.tick_hours, state.hours_total) == RISK_STEP_HOURS
    chain = zone_chain(seen)
    expected = fit_chain(
        seen.up_runs, seen.down_runs, RISK_STEP_HOURS, fleet=(seen.up_runs, seen.down_runs)
    )
    np.testing.assert_array_equal(chain.matrix, expected.matrix)
    ours = solve_hours([chain], 8.0, 12.0, 0.2, 0.92, 3.06)
    np.testing.assert_array_equal(plan_for(state).want, ours.want)
    rate = spot_stats(seen).preemptions_per_hour
    assert 0.05 < rate < 5.0


def test_more_short_windows_raise_the_rate() -> None:
    prior = zone_history(UP[:100], DOWN[:100])
    observed = zone_history((0.2,) * 10, ())
    assert (
        spot_stats(combine(prior.up_runs, prior.down_runs, observed)).preemptions_per_hour
        > spot_stats(prior).preemptions_per_hour
    )
