"""One solve serves every job alike: a job's plan read off a shared plan of a larger
deadline and slack is the plan solved for the job alone."""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import job_plan, shared_steps, solve

RNG = np.random.default_rng(11)
UP = tuple(float(x) for x in np.round(RNG.lognormal(0.0, 1.2, 80), 3))
DOWN = tuple(float(x) for x in np.round(RNG.lognormal(-0.5, 1.0, 80), 3))


@pytest.mark.parametrize("restart", [1, 3])
@pytest.mark.parametrize(("work", "deadline"), [(1, 1), (4, 9), (13, 36), (18, 36), (7, 30)])
def test_a_job_plan_read_off_a_shared_one_is_the_job_own(
    work: int, deadline: int, restart: int
) -> None:
    chain = fit_chain(UP, DOWN, 0.25, fleet=(UP, DOWN))
    own = solve([chain], work, deadline, restart, 0.3, 1.0)
    shared_deadline, shared_slack = shared_steps(work, deadline)
    assert shared_deadline >= deadline and shared_slack >= deadline - work
    shared = solve([chain], shared_deadline - shared_slack, shared_deadline, restart, 0.3, 1.0)
    mine = job_plan(shared, work, deadline)
    assert (mine.work, mine.deadline, mine.slack, mine.restart) == (
        own.work,
        own.deadline,
        own.slack,
        own.restart,
    )
    assert mine.want.shape == own.want.shape
    np.testing.assert_array_equal(mine.want, own.want)


def test_a_shared_plan_too_small_for_the_job_is_refused() -> None:
    chain = fit_chain(UP, DOWN, 0.25, fleet=(UP, DOWN))
    shared = solve([chain], 4, 10, 1, 0.3, 1.0)
    with pytest.raises(ValueError):
        job_plan(shared, 4, 12)  # a later deadline
    with pytest.raises(ValueError):
        job_plan(shared, 2, 10)  # more slack
