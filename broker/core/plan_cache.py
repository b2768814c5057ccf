"""Solved spot plans kept by their inputs, the least recently used dropped past a byte budget.

A plan (``broker.core.spot_mdp.SpotPlan``) is solved per job shape (its zones' history, work,
deadline, restart, prices) and asked again on every observation of the job: tens of
milliseconds to solve, tens of kilobytes to a few megabytes to keep. A count-bounded cache
smaller than the number of live jobs misses on every observation; this one is bounded by the
memory its plans hold instead, and counts its hits and misses. Safe across the threads of
one process.

Several processes (Celery's pool, several workers, the API) each keep their own plans; a
``PlanStore`` the caller attaches (``shared``) lets them share solves: a plan one process
solved is loaded, not solved again, by the next that needs it (``key_digest`` names it the
same in every process). Pure: the store is the caller's; this module does no I/O.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from broker.core.spot_mdp import SOLVER_VERSION, SpotPlan

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CacheStats:
    """Lookups answered from the cache, plans solved, plans and bytes held now."""

    hits: int
    misses: int
    plans: int
    bytes: int
    shared: int = 0  # of the misses, plans another process had solved (loaded, not solved)

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


def plan_bytes(plan: SpotPlan) -> int:
    """The memory a plan's arrays hold."""
    return int(plan.want.nbytes + plan.edges.nbytes)


class PlanStore(Protocol):
    """Plans shared between processes, by ``key_digest``; a store that fails answers None."""

    def load(self, digest: str) -> SpotPlan | None: ...

    def save(self, digest: str, plan: SpotPlan) -> None: ...


def key_digest(key: Hashable) -> str:
    """A plan key's name, the same in every process (``hash`` of a str is not): the digest of
    its ``repr`` (keys are tuples of numbers, whose repr is exact) with the solver's version,
    so a plan an older solver saved is not read as this one's."""
    named = repr((SOLVER_VERSION, key)).encode()
    return hashlib.blake2b(named, digest_size=16).hexdigest()


class PlanCache:
    """Plans by key, least recently used evicted once they hold more than ``max_bytes``
    (the latest plan is always kept, however large); on a miss, the ``shared`` store's plan
    if it has one, else a solve, saved there for the other processes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, shared: PlanStore | None = None) -> None:
        self.max_bytes = max_bytes
        self.shared = shared
        self._shared_hits = 0
        self._plans: OrderedDict[Hashable, SpotPlan] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, solve: Callable[[], SpotPlan]) -> SpotPlan:
        """The plan for ``key``, solved by ``solve`` when not held."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self._hits += 1
                return plan
            self._misses += 1
        # outside the lock: a solve takes milliseconds to seconds
        plan = self._shared_or_solved(key, solve)
        with self._lock:
            if key not in self._plans:
                self._plans[key] = plan
                self._bytes += plan_bytes(plan)
            while self._bytes > self.max_bytes and len(self._plans) > 1:
                _, dropped = self._plans.popitem(last=False)
                self._bytes -= plan_bytes(dropped)
        return plan

    def _shared_or_solved(self, key: Hashable, solve: Callable[[], SpotPlan]) -> SpotPlan:
        store = self.shared
        if store is None:
            return solve()
        digest = key_digest(key)
        plan = store.load(digest)
        if plan is not None:
            with self._lock:
                self._shared_hits += 1
            return plan
        plan = solve()
        store.save(digest, plan)
        return plan

    def stats(self) -> CacheStats:
        """Hits, misses, plans and bytes so far."""
        with self._lock:
            return CacheStats(
                self._hits, self._misses, len(self._plans), self._bytes, self._shared_hits
            )

    def clear(self) -> None:
        """Drop every plan (the counts stay)."""
        with self._lock:
            self._plans.clear()
            self._bytes = 0
