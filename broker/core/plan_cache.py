"""Solved spot plans kept by their inputs, the least recently used dropped past a byte budget.

A plan (``broker.core.spot_mdp.SpotPlan``) is solved per job shape (its zones' history, work,
deadline, restart, prices) and asked again on every observation of the job: tens of
milliseconds to solve, tens of kilobytes to a few megabytes to keep. A count-bounded cache
smaller than the number of live jobs misses on every observation; this one is bounded by the
memory its plans hold instead, and counts its hits and misses. Pure: no I/O; safe across the
threads of one process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from broker.core.spot_mdp import SpotPlan

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CacheStats:
    """Lookups answered from the cache, plans solved, plans and bytes held now."""

    hits: int
    misses: int
    plans: int
    bytes: int

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


def plan_bytes(plan: SpotPlan) -> int:
    """The memory a plan's arrays hold."""
    return int(plan.want.nbytes + plan.edges.nbytes)


class PlanCache:
    """Plans by key, least recently used evicted once they hold more than ``max_bytes``
    (the latest plan is always kept, however large)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
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
        plan = solve()  # outside the lock: a solve takes milliseconds to seconds
        with self._lock:
            if key not in self._plans:
                self._plans[key] = plan
                self._bytes += plan_bytes(plan)
            while self._bytes > self.max_bytes and len(self._plans) > 1:
                _, dropped = self._plans.popitem(last=False)
                self._bytes -= plan_bytes(dropped)
        return plan

    def stats(self) -> CacheStats:
        """Hits, misses, plans and bytes so far."""
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._plans), self._bytes)

    def clear(self) -> None:
        """Drop every plan (the counts stay)."""
        with self._lock:
            self._plans.clear()
            self._bytes = 0
