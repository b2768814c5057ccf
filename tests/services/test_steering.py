"""Steering running jobs on a real database: spot to on-demand and back, starting markets,
within the job's reservation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from broker.core import policy
from broker.db.models import Job, Team
from broker.services import agent_reports, lifecycle
from broker.services.ledger import book_spend, job_reserved, job_spent, team_budget
from broker.services.plans import job_plan
from broker.services.quoting import get_planning
from broker.services.reservations import finish_on_demand, offer_prices
from broker.services.steering import (
    MOVE_BACK_HOURS,
    REFUSED_HOURS,
    candidate_zones,
    fleet_view,
    market_now,
    move_back_excluded,
    policy_state,
    steer,
)
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen, steady_spot


def test_spot_attempt_moves_to_on_demand_when_slack_no_longer_covers_a_restart(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    attempt, token = run_spot(job)
    clock.advance(1800)
    agent_reports.record_progress(session, attempt.id, token, 100, f"jobs/{job.id}/k", clock.now())
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Near the deadline with most of the work left: spot can no longer be risked.
    clock.set(job.deadline - timedelta(hours=1))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def test_spot_attempt_that_alone_can_still_finish_is_kept_when_on_demand_cannot(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    attempt, token = run_spot(job)
    clock.advance(1800)
    # 90 % done on spot, none of it checkpointed: on-demand would start from zero.
    agent_reports.record_progress(
        session, attempt.id, token, job.total_work * 0.9, None, clock.now()
    )
    job = session.get(Job, job.id)
    spot_finish = 0.1 * job.total_work / planning.rate(session, job, "V100", 1)
    od_hours = min(
        c.expected_hours
        for c in planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    )
    assert spot_finish < od_hours / 2
    clock.set(job.deadline - timedelta(hours=(spot_finish + od_hours) / 2))
    assert not planning.plans_for_job(session, job, clock.now(), market="on_demand").choices
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # Once even the running instance cannot finish, it moves (and the re-plan stops the job).
    clock.set(job.deadline - timedelta(hours=spot_finish / 2))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def _on_demand(session, job, clock):  # type: ignore[no-untyped-def]
    plan = {**SPOT_PLAN, "market": "on_demand"}
    attempt, token = lifecycle.begin_attempt(session, job.id, chosen(plan, 3_060_000), clock.now())
    lifecycle.launch_succeeded(session, attempt.id, "i-od", clock.now(), lease_seconds=LEASE)
    return attempt, token


def _refuse_spot_everywhere(session, jobs, clock):  # type: ignore[no-untyped-def]
    """Spot launches refused for capacity in every zone of SPOT_PLAN's shape, taking turns
    among ``jobs`` (so none reaches its limit of failed launches in a row)."""
    zones = candidate_zones(get_planning(), "aws", SPOT_PLAN["instance_type"], "use1-az1")
    for i, zone in enumerate(zones):
        plan = chosen({**SPOT_PLAN, "zone": zone}, SPOT_PRICE)
        refused, _ = lifecycle.begin_attempt(session, jobs[i % len(jobs)].id, plan, clock.now())
        lifecycle.launch_failed(session, refused.id, "capacity", clock.now())


def test_on_demand_attempt_moves_back_to_spot_when_the_saving_pays_for_the_lost_work(
    session, clock, submit
):
    steady_spot(session, clock.now())
    job = submit()
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)  # past the restart overhead
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # A quarter of the work past the checkpoint: spot's saving on the rest still pays for
    # doing it again (the policy's ``spot_pays``).
    clock.advance(1800)
    agent_reports.record_progress(
        session, attempt.id, token, 50 + job.total_work / 4, None, clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Most of it: doing it again costs more than spot would save. Stay.
    agent_reports.record_progress(
        session, attempt.id, token, 50 + job.total_work * 0.8, None, clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_stays_when_spot_was_last_refused_or_the_deadline_is_close(
    session, clock, submit
):
    steady_spot(session, clock.now())
    job = submit()
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    other = submit(budget=2_000_000_000)
    # Another job's on-demand launch there is refused: that says nothing about spot.
    od_plan = {**SPOT_PLAN, "market": "on_demand"}
    refused, _ = lifecycle.begin_attempt(session, other.id, chosen(od_plan, 3_060_000), clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Its spot launches in every zone of the shape are refused: no spot for a while.
    _refuse_spot_everywhere(session, [other, submit(budget=3_000_000_000)], clock)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    clock.advance(3600 * 1.5)
    agent_reports.record_progress(
        session, attempt.id, token, 60, f"jobs/{job.id}/ckpt-60", clock.now()
    )
    job = session.get(Job, job.id)
    # The refusals are past the hour a launch avoids a zone for, but spot was last seen
    # refused everywhere: leaving the on-demand instance blind would cost a restart if
    # refused again (a new job's launch, which risks nothing, finds out). Stay...
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    # ... for MOVE_BACK_HOURS; then try.
    clock.advance(3600 * (MOVE_BACK_HOURS - 1.5) + 60)
    agent_reports.record_progress(
        session, attempt.id, token, 70, f"jobs/{job.id}/ckpt-70", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    # Close to the deadline a spot start is no longer safe.
    clock.set(job.deadline - timedelta(hours=1))
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_on_demand_attempt_of_an_on_demand_job_never_moves(session, clock, submit):
    job = submit(market="on_demand")
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(get_planning(), session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_job_refused_spot_in_every_known_zone_waits_while_its_slack_allows(session, clock, submit):
    job = submit()  # 48 h to its deadline: time to wait for spot
    planning = get_planning()
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "spot"
    _refuse_spot_everywhere(session, [job, submit(budget=2_000_000_000)], clock)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "wait"
    # An hour later the refusal has aged out: spot is believed there again, and asked for
    clock.advance(3600 * 1.5)
    state = policy_state(planning, session, job, None, clock.now(), 0.1)
    assert state is not None and all(state.spot_obtainable)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) in ("spot", "wait")


def test_job_refused_spot_everywhere_starts_on_demand_once_waiting_would_risk_its_deadline(
    session, clock, submit
):
    planning = get_planning()
    loose = submit()
    _refuse_spot_everywhere(session, [loose, submit(budget=2_000_000_000)], clock)
    assert market_now(planning, session, loose, clock.now(), tick_hours=0.1) == "wait"
    # the same refusals, and a deadline that leaves no time to wait for spot
    tight = submit(budget=3_000_000_000)
    state = policy_state(planning, session, tight, None, clock.now(), 0.1)
    assert state is not None
    work = state.work_left_hours + state.restart_hours
    tight.deadline = clock.now() + timedelta(hours=work + 0.1)
    session.add(tight)
    session.commit()
    assert market_now(planning, session, tight, clock.now(), tick_hours=0.1) == "on_demand"


def test_a_zone_spot_was_seen_in_since_its_refusal_is_spot_to_be_had_again(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    _refuse_spot_everywhere(session, [job, submit(budget=2_000_000_000)], clock)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "wait"
    clock.advance(600)
    run_spot(submit(budget=3_000_000_000))  # another job's launch gets spot in use1-az1
    clock.advance(600)
    state = policy_state(planning, session, job, None, clock.now(), 0.1)
    assert state is not None
    obtainable = dict(zip(state.zones, state.spot_obtainable, strict=True))
    assert obtainable["use1-az1"] and not any(v for z, v in obtainable.items() if z != "use1-az1")
    # spot, or a wait that asks for it: either way a spot launch, never on-demand
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) in ("spot", "wait")


def test_the_policy_sees_the_jobs_own_prices_spend_reservation_and_zones(
    session, clock, submit, run_spot
):
    job = submit()
    planning = get_planning()
    attempt, _ = run_spot(job)
    state = policy_state(planning, session, job, attempt, clock.now(), 0.1)
    assert state is not None
    _, on_demand = offer_prices(planning, "aws", "use1-az1", "p3.2xlarge") or (0, 0)
    assert (state.spot_price, state.on_demand_price) == (SPOT_PRICE / 1e6, on_demand / 1e6)
    spent, held = job_spent(session, job.id), job_reserved(session, job.id)
    assert (state.spent, state.reserved) == (spent / 1e6, (spent + held) / 1e6)
    finish = finish_on_demand(planning, session, job, clock.now(), 0.1)
    assert state.on_demand_cost == finish / 1e6 < state.reserved
    assert state.zones == ("use1-az1",)  # the shape's other zones: no launch tried them yet
    shape_zones = candidate_zones(planning, "aws", SPOT_PLAN["instance_type"], "use1-az1")
    other = submit(budget=2_000_000_000)
    tried, _ = lifecycle.begin_attempt(
        session, other.id, chosen({**SPOT_PLAN, "zone": shape_zones[-1]}, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_failed(session, tried.id, "capacity", clock.now())
    state = policy_state(planning, session, job, attempt, clock.now(), 0.1)
    assert state is not None and state.zones == ("use1-az1", shape_zones[-1])
    assert state.spot_obtainable == (True, False)


def _spend_down_to_finishing_on_demand(session, job, attempt, clock):  # type: ignore[no-untyped-def]
    """Book spend until the job holds just what finishing on on-demand costs."""
    finish = finish_on_demand(get_planning(), session, job, clock.now(), 0.1)
    book_spend(session, job, attempt, job_reserved(session, job.id) - int(finish), clock.now())
    session.commit()


def _leave_the_team_nothing_free(session, job, clock):  # type: ignore[no-untyped-def]
    """Lower the team's limit to what it has spent and holds: no budget left to hold more."""
    team = session.get(Team, job.team_id)
    figures = team_budget(session, team, clock.now())
    team.budget_limit_micros = figures.spent + figures.reserved
    session.add(team)
    session.commit()


def _running_spot_with_progress(session, clock, submit, run_spot, **spec):  # type: ignore[no-untyped-def]
    job = submit(**spec)
    attempt, token = run_spot(job)
    clock.advance(1800)
    agent_reports.record_progress(session, attempt.id, token, 100, f"jobs/{job.id}/k", clock.now())
    return session.get(Job, job.id), attempt


def test_spot_holds_more_rather_than_leave_for_on_demand_only_because_the_job_holds_too_little(
    session, clock, submit, run_spot
):
    job, attempt = _running_spot_with_progress(session, clock, submit, run_spot)
    planning = get_planning()
    _spend_down_to_finishing_on_demand(session, job, attempt, clock)
    held = job_spent(session, job.id) + job_reserved(session, job.id)
    state = policy_state(planning, session, job, attempt, clock.now(), 0.1)
    assert state is not None and policy.net_need(state, policy.CONTINUE) > held / 1e6
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    topped = job_spent(session, job.id) + job_reserved(session, job.id)
    # the net's need and an hour of spot ahead, from the team's free budget
    need = policy.net_need(state, policy.CONTINUE)
    assert topped / 1e6 == pytest.approx(
        need + state.spot_price * policy.HOLD_AHEAD_HOURS, abs=1e-5
    )
    # the hour ahead: the next tick finds it held and asks for nothing
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    assert job_spent(session, job.id) + job_reserved(session, job.id) == topped


def test_spot_moves_to_on_demand_once_the_job_holds_only_finishing_there_and_can_hold_no_more(
    session, clock, submit, run_spot
):
    planning = get_planning()
    job, attempt = _running_spot_with_progress(session, clock, submit, run_spot)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"
    _spend_down_to_finishing_on_demand(session, job, attempt, clock)
    _leave_the_team_nothing_free(session, job, clock)
    held = job_reserved(session, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "on_demand"
    assert job_reserved(session, job.id) == held  # a top-up short of the need is not taken
    # max_cost reached: the same, whatever the team has free
    other, attempt = _running_spot_with_progress(
        session, clock, submit, run_spot, budget=2_000_000_000
    )
    _spend_down_to_finishing_on_demand(session, other, attempt, clock)
    other.max_cost_micros = job_spent(session, other.id) + job_reserved(session, other.id)
    session.add(other)
    session.commit()
    assert steer(planning, session, other, attempt, clock.now(), tick_hours=0.1) == "on_demand"


def test_on_demand_stays_once_the_reservation_only_covers_finishing_there(session, clock, submit):
    steady_spot(session, clock.now())
    job = submit()
    planning = get_planning()
    attempt, token = _on_demand(session, job, clock)
    clock.advance(900)
    agent_reports.record_progress(
        session, attempt.id, token, 50, f"jobs/{job.id}/ckpt-50", clock.now()
    )
    job = session.get(Job, job.id)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "spot"
    _spend_down_to_finishing_on_demand(session, job, attempt, clock)
    _leave_the_team_nothing_free(session, job, clock)
    assert steer(planning, session, job, attempt, clock.now(), tick_hours=0.1) == "continue"


def test_auto_job_planned_on_demand_starts_on_spot_when_the_policy_says_so(session, clock, submit):
    # the planner keeps room for a whole spot run and another on on-demand; the policy knows
    # it can leave spot in time, as the simulator lets it
    job = submit(deadline=(clock.now() + timedelta(hours=6)).isoformat())
    plan = job_plan(job)
    assert plan is not None and plan.market == "on_demand"
    planning = get_planning()
    steady_spot(session, clock.now())
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "spot"
    assert planning.plans_for_job(session, job, clock.now(), market="spot").choices


def _mixed_machine_type() -> tuple[str, str, list[int]]:
    """A Compute Engine zone and N1 machine type offered with several GPU shapes (rows)."""
    offers = get_planning().offers
    seen: dict[tuple[str, str], list[int]] = {}
    for i in range(len(offers.zone)):
        if offers.provider[i] == "gcp":
            seen.setdefault((str(offers.zone[i]), str(offers.instance_type[i])), []).append(i)
    zone, machine = next(key for key, rows in seen.items() if len(rows) > 2)
    return zone, machine, seen[(zone, machine)]


def test_an_n1_machine_s_prices_are_those_of_the_gpus_it_carries() -> None:
    # An N1 type carries any of several GPUs, one or more: the policy must price the
    # attempt's own (a demo job on 2 x L4 saw spot $2.18/h against on-demand $1.96/h, the
    # first row's, and left spot for on-demand).
    planning = get_planning()
    offers = planning.offers
    zone, machine, rows = _mixed_machine_type()
    for i in rows:
        gpu, count = str(offers.gpu[i]), int(offers.gpu_count[i])
        assert offer_prices(planning, "gcp", zone, machine, gpu, count) == (
            int(offers.spot_micros_per_hour[i]),
            int(offers.on_demand_micros_per_hour[i]),
        )
    assert (
        len(
            {
                offer_prices(
                    planning, "gcp", zone, machine, str(offers.gpu[i]), int(offers.gpu_count[i])
                )
                for i in rows
            }
        )
        > 1
    )


def test_a_shape_s_zones_are_those_offering_its_gpus_on_spot() -> None:
    planning = get_planning()
    offers = planning.offers
    zone, machine, rows = _mixed_machine_type()
    i = rows[-1]
    gpu, count = str(offers.gpu[i]), int(offers.gpu_count[i])
    zones = candidate_zones(planning, "gcp", machine, zone, gpu, count)
    for other in zones[1:]:
        assert offer_prices(planning, "gcp", other, machine, gpu, count) is not None
    every = candidate_zones(planning, "gcp", machine, zone)
    assert set(zones) <= set(every)


def test_a_refusal_keeps_a_move_back_out_of_its_region_until_spot_is_seen_there(
    session, clock, submit
):
    planning = get_planning()
    refused, _ = lifecycle.begin_attempt(
        session, submit().id, chosen(SPOT_PLAN, SPOT_PRICE), clock.now()
    )
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())  # use1-az1
    clock.advance(int(3600 * (REFUSED_HOURS + 0.5)))
    zones = candidate_zones(planning, "aws", SPOT_PLAN["instance_type"], "use1-az1")
    east = {z for z in zones if z.startswith("use1-")}
    others = set(zones) - east
    assert len(east) > 1 and others
    # Past the hour a launch avoids the zone, a move back avoids its whole region: a
    # region's zones run out of spot together.
    excluded = move_back_excluded(planning, fleet_view(session, clock.now()))
    assert east <= excluded and not others & excluded
    # A zone of it where an attempt has seen spot since is open again; the rest stay closed.
    seen, _ = lifecycle.begin_attempt(
        session,
        submit(budget=2_000_000_000).id,
        chosen({**SPOT_PLAN, "zone": sorted(east - {"use1-az1"})[0]}, SPOT_PRICE),
        clock.now(),
    )
    lifecycle.launch_succeeded(session, seen.id, "i-seen", clock.now(), lease_seconds=LEASE)
    excluded = move_back_excluded(planning, fleet_view(session, clock.now()))
    assert excluded & set(zones) == east - {seen.zone}
    # Once the refusal is MOVE_BACK_HOURS old, nothing is.
    clock.advance(int(3600 * (MOVE_BACK_HOURS - REFUSED_HOURS)))
    assert move_back_excluded(planning, fleet_view(session, clock.now())) == set()


def test_candidate_zones_keep_to_the_job_s_regions():
    planning = get_planning()
    shape = ("aws", SPOT_PLAN["instance_type"], "use1-az1")
    every = candidate_zones(planning, *shape)
    offers = planning.offers
    region_of = dict(zip(offers.zone.tolist(), offers.region.tolist(), strict=True))
    assert len({region_of[z] for z in every}) > 1  # the shape is offered in several regions
    mine = candidate_zones(planning, *shape, regions=["us-east-1"])
    assert mine[0] == "use1-az1" and len(mine) > 1
    assert {region_of[z] for z in mine} == {"us-east-1"}
    assert set(mine) < set(every)


def test_the_policy_weighs_only_zones_the_job_may_run_in(session, clock, submit):
    # another job's refusal in us-west-2 puts that zone in the broker's view; a job pinned
    # to us-east-1 never weighs it
    job = submit(resources={"gpus": 1, "regions": ["us-east-1"]})
    other = submit(budget=2_000_000_000)
    west = [
        z
        for z in candidate_zones(get_planning(), "aws", SPOT_PLAN["instance_type"], "use1-az1")
        if z.startswith("usw2")
    ]
    plan = chosen({**SPOT_PLAN, "zone": west[0], "region": "us-west-2"}, SPOT_PRICE)
    refused, _ = lifecycle.begin_attempt(session, other.id, plan, clock.now())
    lifecycle.launch_failed(session, refused.id, "capacity", clock.now())
    state = policy_state(get_planning(), session, job, None, clock.now(), 0.1)
    assert state is not None
    assert west[0] not in state.zones
    assert all(z.startswith("use1") for z in state.zones)


def test_a_job_whose_policy_holds_nothing_waits_for_spot_rather_than_start_on_demand(
    session, clock, submit, monkeypatch
):
    # market_now's reading of the policy, whose own decisions test_policy checks: spot is
    # believed there, the policy holds nothing this tick (its plan would rather wait); the
    # job waits asking for spot, as the simulated broker, not on its admission plan's market
    job = submit()
    planning = get_planning()
    state = policy_state(planning, session, job, None, clock.now(), 0.1)
    assert state is not None and any(state.spot_obtainable)
    monkeypatch.setattr(policy, "decide", lambda state: policy.CONTINUE)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "wait"
    monkeypatch.setattr(policy, "decide", lambda state: policy.ON_DEMAND)
    assert market_now(planning, session, job, clock.now(), tick_hours=0.1) == "on_demand"
