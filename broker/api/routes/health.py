"""``GET /healthz``: the database answers, and whether the workers and the beat are alive.

Unauthenticated and fast: the liveness comes from the process's ``LivenessMonitor`` (started
by the first call, which waits for its first probe), never from a probe made for the request.
It names no host and holds no secret, only counts and ages.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from broker import clock
from broker.api.deps import NowDep, SessionDep, SessionRoute
from broker.services import spend_control
from broker.services.liveness import Liveness, LivenessMonitor
from broker.settings import get_settings


@asynccontextmanager
async def _stop_monitor(app: FastAPI) -> AsyncIterator[None]:
    yield
    monitor = getattr(app.state, "liveness", None)
    if monitor is not None:
        monitor.stop()


router = APIRouter(tags=["ops"], lifespan=_stop_monitor, route_class=SessionRoute)


_creating = threading.Lock()


def _monitor(request: Request) -> LivenessMonitor:
    """The app's monitor, started by the first call (which waits a moment for a first probe)."""
    state = request.app.state
    with _creating:
        monitor: LivenessMonitor | None = getattr(state, "liveness", None)
        if monitor is None:
            monitor = state.liveness = LivenessMonitor.from_settings(get_settings())
    return monitor.start(wait_seconds=2.0)


def _seen(now: datetime, age: float | None) -> str | None:
    """When, on the broker's clock, something last heard ``age`` wall seconds ago was heard."""
    if age is None:
        return None
    return (now - timedelta(seconds=age * clock.scale())).isoformat()


def _report(liveness: Liveness, now: datetime, lapsed: int, late: float) -> dict[str, Any]:
    return {
        "status": "ok" if liveness.ok and not lapsed else "degraded",
        "time": now.isoformat(),
        "workers": {
            "alive": liveness.workers_alive,
            "last_seen": _seen(now, liveness.worker_age),
            "silent_seconds": _rounded(liveness.worker_age),
        },
        "beat": {
            "alive": liveness.beat_alive,
            "last_seen": _seen(now, liveness.beat_age),
            "silent_seconds": _rounded(liveness.beat_age),
        },
        "timeout_seconds": liveness.timeout,
        # Running attempts past their spend lease: the control loop is behind (broker s).
        "loop": {"behind": lapsed > 0, "lapsed_leases": lapsed, "late_seconds": round(late, 1)},
    }


def _rounded(age: float | None) -> float | None:
    return None if age is None else round(age, 1)


@router.get("/healthz")
def healthz(request: Request, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """200 while the API and its database answer: ``status`` is ``ok``, or ``degraded`` when no
    worker answered, beat was not heard for ``timeout_seconds``, or the control loop is behind
    (running attempts past their spend lease); ``time`` is the broker's clock (scaled in
    demos), ``last_seen`` on the same clock, ``silent_seconds`` wall seconds."""
    lapsed, late = spend_control.lapsed(session, now)
    return _report(_monitor(request).view(), now, lapsed, late)
