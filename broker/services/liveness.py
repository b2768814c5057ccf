"""Whether the Celery workers and the beat are alive, as ``GET /healthz`` reports it.

Beat sends a tiny heartbeat task (``HEARTBEAT_TASK``) every ``heartbeat_seconds``; a worker's
main process notes when one last reached it (``tasks.liveness``). The API asks every worker
for that age with Celery's remote control (``PROBE_COMMAND``, a broadcast through the Celery
broker: any machine, any transport with fan-out, kombu's file-system one included, and no
table of our own). A worker that answers is alive; the freshest age says when beat was last
heard. ``LivenessMonitor`` probes from a thread of the API process and keeps the last view,
so ``/healthz`` never waits on a probe after the first.

Ages are wall seconds measured on one machine each (no clock skew between hosts); a worker or
beat silent for more than ``liveness_timeout_seconds`` counts as dead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.services.dispatch import celery_client
from broker.settings import Settings

log = logging.getLogger(__name__)

PROBE_COMMAND = "broker_liveness"
HEARTBEAT_TASK = "tasks.liveness.heartbeat"

Probe = Callable[[], Mapping[str, float | None]]
"""Asks the workers; returns each answering worker's hostname and its beat age (None: none
heard yet)."""


@dataclass(frozen=True)
class Liveness:
    """What the last probes found; ages are wall seconds, None when never heard."""

    workers_alive: int
    worker_age: float | None
    beat_age: float | None
    timeout: float

    @property
    def beat_alive(self) -> bool:
        return self.beat_age is not None and self.beat_age <= self.timeout

    @property
    def ok(self) -> bool:
        return self.workers_alive > 0 and self.beat_alive


def celery_probe(settings: Settings, reply_seconds: float = 1.0) -> Probe:
    """A probe over the Celery broker: a broadcast that waits ``reply_seconds`` for answers."""
    client = celery_client(settings)

    def probe() -> dict[str, float | None]:
        replies: list[dict[str, Any]] = client.control.broadcast(
            PROBE_COMMAND, reply=True, timeout=reply_seconds
        )
        answers: dict[str, float | None] = {}
        for reply in replies or []:
            for hostname, body in reply.items():
                age = body.get("beat_age") if isinstance(body, dict) else None
                answers[hostname] = float(age) if isinstance(age, int | float) else None
        return answers

    return probe


class LivenessMonitor:
    """Probes every ``interval`` seconds on a daemon thread; ``view()`` is the latest picture."""

    def __init__(
        self,
        probe: Probe,
        interval: float,
        timeout: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.interval = interval
        self.timeout = timeout
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._workers: dict[str, float] = {}  # hostname -> when it last answered
        self._beat: float | None = None  # when beat's heartbeat last reached a worker
        self._stop = threading.Event()
        self._probed = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> LivenessMonitor:
        reply_seconds = min(1.0, settings.heartbeat_seconds / 2)
        return cls(
            celery_probe(settings, reply_seconds),
            settings.heartbeat_seconds,
            settings.liveness_timeout_seconds,
        )

    def probe_once(self) -> None:
        """Ask the workers once; a failure (the Celery broker down) is logged and changes nothing,
        so what was heard ages until it counts as dead."""
        try:
            answers = self.probe()
        except Exception as error:  # any transport's error: the monitor must go on
            log.warning("liveness probe failed: %s", error)
            return
        now = self._monotonic()
        with self._lock:
            for hostname, beat_age in answers.items():
                self._workers[hostname] = now
                if beat_age is not None and (self._beat is None or now - beat_age > self._beat):
                    self._beat = now - beat_age

    def view(self) -> Liveness:
        """The latest picture, at this moment."""
        now = self._monotonic()
        with self._lock:
            ages = [now - seen for seen in self._workers.values()]
            beat = self._beat
        return Liveness(
            workers_alive=sum(1 for age in ages if age <= self.timeout),
            worker_age=min(ages) if ages else None,
            beat_age=None if beat is None else now - beat,
            timeout=self.timeout,
        )

    def start(self, wait_seconds: float = 0.0) -> LivenessMonitor:
        """Start probing, the first time only; then wait up to ``wait_seconds`` for the first
        probe to finish (later calls never wait)."""
        with self._lock:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._run, name="liveness-probe", daemon=True)
            self._thread.start()
        self._probed.wait(wait_seconds)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._probed.set()
            self._stop.wait(self.interval)
