"""The workers' and the beat's side of liveness (``broker.services.liveness``).

- Beat sends ``heartbeat`` every ``heartbeat_seconds``; the worker's main process notes when
  one last reached it (``task_received``, before the pool runs the empty task).
- The API's probe (``PROBE_COMMAND``) is answered by the worker's main process with the age
  of that note: answering at all says the worker is alive.
- An embedded beat (``celery worker --beat``) is a child process of the worker; it is told to
  stop when the worker dies, so no orphaned beat keeps sending ticks.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from celery import signals
from celery.worker.control import inspect_command

from broker.services.liveness import HEARTBEAT_TASK, PROBE_COMMAND
from tasks.celery_app import app

_beat_heard: float | None = None  # time.monotonic() in the worker's main process


@app.task(name=HEARTBEAT_TASK, ignore_result=True)
def heartbeat() -> None:
    """Beat's heartbeat: that it reached a worker is the news (``_heard``)."""


@signals.task_received.connect
def _heard(request: Any = None, **_: Any) -> None:
    global _beat_heard
    if request is not None and request.name == HEARTBEAT_TASK:
        _beat_heard = time.monotonic()


@inspect_command(name=PROBE_COMMAND)
def _answer_probe(state: Any, **_: Any) -> dict[str, float | None]:
    """The worker is alive; beat was last heard ``beat_age`` seconds ago (None: not yet)."""
    heard = _beat_heard
    return {"beat_age": None if heard is None else time.monotonic() - heard}


@signals.beat_embedded_init.connect
def _die_with_worker(**_: Any) -> None:
    """In an embedded beat's process: SIGTERM when the worker that forked it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the worker died before the line above
        os._exit(0)
