"""The policy's plans shared between the processes of one machine: one ``.npz`` file per plan
in a folder (``Settings.plan_store_dir``, default ``data_dir/plans``), named by the plan key's
digest. Celery's pool processes, several workers and the API each solve a plan only when no
process on the machine has solved it yet. A cache: a file that cannot be read or written is a
solve, never an error; the folder is pruned to its newest ``max_files``."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

import numpy as np

from broker.core.plan_cache import PlanCache
from broker.core.spot_mdp import SpotPlan

log = logging.getLogger(__name__)


class DiskPlanStore:
    """``broker.core.plan_cache.PlanStore`` on a folder of ``<digest>.npz`` files."""

    def __init__(self, folder: Path, max_files: int = 4096) -> None:
        self.folder = Path(folder)
        self.max_files = max_files
        self._saved = 0

    def load(self, digest: str) -> SpotPlan | None:
        """The plan saved under ``digest``, or None."""
        try:
            with np.load(self.folder / f"{digest}.npz") as data:
                step, work, deadline, restart = data["shape"].tolist()
                return SpotPlan(
                    step_hours=float(step),
                    work=int(work),
                    deadline=int(deadline),
                    restart=int(restart),
                    edges=data["edges"],
                    want=data["want"],
                )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as error:
            log.debug("plan %s unreadable, solving it: %s", digest, error)
            return None

    def save(self, digest: str, plan: SpotPlan) -> None:
        """Write the plan (whole: a temporary file renamed into place); prune now and then."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial = self.folder / f".{digest}.{secrets.token_hex(4)}.npz"
            shape = np.array([plan.step_hours, plan.work, plan.deadline, plan.restart])
            np.savez(partial, shape=shape, edges=plan.edges, want=plan.want)
            os.replace(partial, self.folder / f"{digest}.npz")
        except OSError as error:
            log.debug("plan %s not saved: %s", digest, error)
            return
        self._saved += 1
        if self._saved % 256 == 0:
            self.prune()

    def prune(self) -> int:
        """Remove all but the newest ``max_files`` plans; returns how many went."""
        try:
            files = sorted(self.folder.glob("*.npz"), key=lambda f: f.stat().st_mtime)
        except OSError:
            return 0
        extra = files[: max(len(files) - self.max_files, 0)]
        for old in extra:
            old.unlink(missing_ok=True)
        return len(extra)


def share_plans(cache: PlanCache, folder: Path) -> None:
    """Let ``cache`` load the plans other processes solved into ``folder`` (and save its own)."""
    cache.shared = DiskPlanStore(folder)
