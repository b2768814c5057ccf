"""The policy's plan cache: bounded by the bytes its plans hold, not by a count of jobs."""

from __future__ import annotations

from broker.core.plan_cache import PlanCache, plan_bytes
from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import solve_hours

UP = (1.0, 2.0, 3.0, 0.5, 5.0)
DOWN = (0.5, 1.0, 0.25, 2.0)


def _solver(work_hours: float, solved: list[float]):  # type: ignore[no-untyped-def]
    def solve():  # type: ignore[no-untyped-def]
        solved.append(work_hours)
        chain = fit_chain(UP, DOWN, 0.25, fleet=(UP, DOWN))
        return solve_hours([chain], work_hours, 10.0, 0.1, 1.0, 3.0)

    return solve


def test_forty_live_jobs_asked_every_tick_are_solved_once_each():
    cache = PlanCache()
    solved: list[float] = []
    jobs = [2.0 + 0.05 * i for i in range(40)]  # more jobs than the old cache's 8 plans
    for _ in range(5):  # five ticks, every job asked each tick
        for work in jobs:
            cache.get(("job", work), _solver(work, solved))
    assert sorted(solved) == jobs
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.plans) == (160, 40, 40)
    assert stats.hit_rate == 0.8


def test_past_its_byte_budget_the_least_recently_used_plan_goes():
    solved: list[float] = []
    one = _solver(2.0, [])()
    cache = PlanCache(max_bytes=2 * plan_bytes(one) + plan_bytes(one) // 2)
    for work in (2.0, 2.0001, 2.0002):  # same shape, so the same size: room for two
        cache.get(work, _solver(work, solved))
    assert cache.stats().plans == 2
    assert cache.stats().bytes <= cache.max_bytes
    cache.get(2.0002, _solver(2.0002, solved))  # kept
    cache.get(2.0, _solver(2.0, solved))  # dropped first, solved again
    assert solved == [2.0, 2.0001, 2.0002, 2.0]


def test_a_plan_larger_than_the_budget_is_still_kept_alone():
    cache = PlanCache(max_bytes=1)
    solved: list[float] = []
    first = cache.get("a", _solver(2.0, solved))
    assert cache.get("a", _solver(2.0, solved)) is first
    assert solved == [2.0] and cache.stats().plans == 1


def test_jobs_alike_share_one_solve():
    """A job's plan depends on its deadline, slack and restart in whole steps (each within a
    shared plan's rounding) and on its spot / on-demand price ratio: jobs that differ only
    within those, or in the scale of their prices, reuse one solve; another ratio, or a
    deadline beyond the shared plan's, solves anew."""
    from broker.core.policy import PLANS, AvailabilityHistory, PolicyState, plan_for

    history = AvailabilityHistory()
    for window, outage in zip(UP, DOWN, strict=False):
        history = history.observe("z", True, window).observe("z", False, outage)

    def state(work: float, spot: float, on_demand: float, hours: float = 12.0) -> PolicyState:
        return PolicyState(
            hours_to_deadline=hours,
            hours_total=hours,
            work_left_hours=work,
            work_total_hours=work,
            restart_hours=0.2,
            tick_hours=1 / 3,
            zones=("z",),
            spot_obtainable=(True,),
            spot_price=spot,
            on_demand_price=on_demand,
            history=history,
        )

    def solves(*states: PolicyState) -> int:
        before = PLANS.stats().misses
        for one in states:
            plan_for(one)
        return PLANS.stats().misses - before

    PLANS.clear()
    assert solves(state(4.01, 0.9, 3.0)) == 1
    # same steps with prices x2; more work (less slack, same shared plan); a shorter deadline
    assert solves(state(4.2, 1.8, 6.0), state(5.0, 0.9, 3.0), state(4.0, 0.9, 3.0, 11.0)) == 0
    plan = plan_for(state(5.0, 0.9, 3.0))
    assert (plan.work, plan.deadline) == (15, 36)  # the job's own steps, read off the shared
    assert solves(state(4.01, 1.2, 3.0)) == 1  # another price ratio
    assert solves(state(4.01, 0.9, 3.0, 20.0)) == 1  # a deadline beyond the shared plan's
