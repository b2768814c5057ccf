"""Plans shared between processes through the plan store's folder: a plan one process solved
is loaded, not solved, by another; a damaged file is solved again, never an error."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from broker.core.plan_cache import PlanCache, key_digest
from broker.core.spot_chain import fit_chain
from broker.core.spot_mdp import solve_hours
from broker.services.plan_store import DiskPlanStore

UP = (1.0, 2.0, 3.0, 0.5, 5.0)
DOWN = (0.5, 1.0, 0.25, 2.0)
KEY = (UP, DOWN, 0.25, 9, 40, 1, 0.3)


def _solver(solved: list[int]):  # type: ignore[no-untyped-def]
    def solve():  # type: ignore[no-untyped-def]
        solved.append(1)
        chain = fit_chain(UP, DOWN, 0.25, fleet=(UP, DOWN))
        return solve_hours([chain], 2.2, 10.0, 0.1, 0.3, 1.0)

    return solve


def test_a_plan_one_process_solved_is_loaded_by_the_next(tmp_path: Path) -> None:
    solved: list[int] = []
    first = PlanCache(shared=DiskPlanStore(tmp_path))  # one process's cache
    second = PlanCache(shared=DiskPlanStore(tmp_path))  # another's, the same folder
    mine = first.get(KEY, _solver(solved))
    theirs = second.get(KEY, _solver(solved))
    assert solved == [1]
    assert (theirs.step_hours, theirs.work, theirs.deadline, theirs.restart) == (
        mine.step_hours,
        mine.work,
        mine.deadline,
        mine.restart,
    )
    np.testing.assert_array_equal(theirs.want, mine.want)
    np.testing.assert_array_equal(theirs.edges, mine.edges)
    assert second.stats().shared == 1 and first.stats().shared == 0
    assert second.get(KEY, _solver(solved)) is theirs  # then kept in memory
    assert list(tmp_path.iterdir()) == [tmp_path / f"{key_digest(KEY)}.npz"]


def test_a_damaged_or_unwritable_store_means_a_solve(tmp_path: Path) -> None:
    solved: list[int] = []
    (tmp_path / f"{key_digest(KEY)}.npz").write_bytes(b"not a plan")
    PlanCache(shared=DiskPlanStore(tmp_path)).get(KEY, _solver(solved))
    assert solved == [1]
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    PlanCache(shared=DiskPlanStore(blocked / "plans")).get(KEY, _solver(solved))
    assert solved == [1, 1]


def test_the_folder_keeps_its_newest_plans(tmp_path: Path) -> None:
    store = DiskPlanStore(tmp_path, max_files=2)
    plan = _solver([])()
    for i in range(4):
        store.save(f"p{i}", plan)
        os.utime(tmp_path / f"p{i}.npz", (1000.0 + i, 1000.0 + i))  # saved in this order
    assert store.prune() == 2
    assert store.load("p0") is None and store.load("p3") is not None


def test_key_digests_are_stable_names() -> None:
    assert key_digest(KEY) == key_digest(tuple(KEY))
    assert key_digest(KEY) != key_digest((*KEY[:-1], 0.31))
    assert len(key_digest(KEY)) == 32
