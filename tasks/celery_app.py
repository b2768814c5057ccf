"""The Celery application: broker URL from settings, late acks, beat schedule; the workers'
logging and metrics folder; the control loop's lag log (embedded stack)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, signals
from kombu import Queue

from broker.devstack.pacing import record_lag
from broker.logs import configure_logging
from broker.private_files import private_dir
from broker.settings import Settings, get_settings


def use_metrics_dir(settings: Settings) -> None:
    """Put this process's prometheus_client in multiprocess mode, writing to the metrics folder.

    prometheus_client picks per-process files or memory when it is first imported, so this runs
    when the Celery app is imported, before the tasks (and ``broker.services.metrics``) are; pool
    processes inherit it. The API reads the folder on ``GET /metrics``.
    """
    folder = settings.resolved_metrics_dir
    private_dir(folder)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)


@signals.setup_logging.connect
def _setup_logging(loglevel: int | None = None, logfile: str | None = None, **_: Any) -> None:
    """The broker's logging (format, redaction) instead of Celery's, at the worker's --loglevel."""
    stream = open(logfile, "a", encoding="utf-8", buffering=1) if logfile else None  # noqa: SIM115
    configure_logging(get_settings(), level=loglevel, stream=stream)


@signals.worker_process_shutdown.connect
def _forget_process(pid: int | None = None, **_: Any) -> None:
    """A pool process ends: drop its live-gauge files (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid or os.getpid(), str(get_settings().resolved_metrics_dir))


# The tasks whose delay (publish to end) measures the control loop: the beat's tick and its fan-out,
# and launches (a job that waits in the queue for its launch loses its slack as surely as
# one observed late).
PACED_TASKS = {
    "tasks.control_loop.tick": "tick",
    "tasks.control_loop.observe": "observe",
    "tasks.control_loop.observe_batch": "observe",
    "tasks.control_loop.launch": "launch",
    "tasks.control_loop.launch_many": "launch",
    "tasks.control_loop.launch_due": "launch",
}


@signals.before_task_publish.connect
def _stamp_published(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every message carries the wall time it was sent (the lag log's delay)."""
    if headers is not None:
        headers.setdefault("published_at", time.time())


def _log_lag(task: str, request: Any, expired: bool = False) -> None:
    path = get_settings().loop_lag_file
    published = request.get("published_at") if request is not None else None
    if path is None or task not in PACED_TASKS or published is None:
        return
    try:
        kind = PACED_TASKS[task] + ("-expired" if expired else "")
        record_lag(path, kind, time.time() - float(published))
    except (OSError, ValueError):
        pass  # a measurement, never a reason to fail the task


@signals.task_postrun.connect
def _task_done(sender: Any = None, **_: Any) -> None:
    """A task's lag is from its publish to its end, when its decisions took effect: a batch
    that starts on time but observes for seconds is as late as one that waited that long."""
    _log_lag(getattr(sender, "name", ""), getattr(sender, "request", None))


@signals.task_revoked.connect
def _task_expired(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    """An observation dropped for lateness counts as late as it was."""
    if expired:
        _log_lag(getattr(sender, "name", ""), request, expired=True)


CONTROL_TASKS = (
    "tasks.control_loop.tick",
    "tasks.control_loop.reconcile",
    "tasks.control_loop.refresh_prices",
    "tasks.control_loop.refit_spot_model",
)


OBSERVE_TASKS = ("tasks.control_loop.observe", "tasks.control_loop.observe_batch")


def make_celery() -> Celery:
    """A Celery app configured from the broker's settings."""
    settings = get_settings()
    control = settings.celery_control_queue
    celery = Celery("broker", include=["tasks.control_loop", "tasks.liveness"])
    celery.conf.update(
        broker_url=settings.resolved_celery_broker_url,
        broker_transport=settings.celery_transport,
        broker_transport_options=settings.celery_transport_options(),
        result_backend=settings.celery_result_backend,
        task_ignore_result=settings.celery_result_backend is None,
        task_default_queue=settings.celery_queue,
        # The beat's own tasks go through a queue of their own that every worker also
        # consumes, so a backlog of observations cannot hold up the spend-lease sweep.
        # Observations have a queue of their own as well: the tick paces each fan-out on
        # its own backlog, so queued launches never starve the watching of what runs.
        task_queues=[
            Queue(settings.celery_queue),
            Queue(settings.celery_observe_queue),
            Queue(control),
        ],
        task_routes={
            **{name: {"queue": control} for name in CONTROL_TASKS},
            **{name: {"queue": settings.celery_observe_queue} for name in OBSERVE_TASKS},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "tick": {"task": "tasks.control_loop.tick", "schedule": settings.tick_seconds},
            "reconcile": {
                "task": "tasks.control_loop.reconcile",
                "schedule": settings.reconcile_seconds,
            },
            "refresh-prices": {
                "task": "tasks.control_loop.refresh_prices",
                "schedule": settings.refresh_prices_seconds,
            },
            "refit-spot-model": {
                "task": "tasks.control_loop.refit_spot_model",
                "schedule": settings.spot_model_refit_seconds,
            },
            "heartbeat": {  # GET /healthz: beat is alive if this reached a worker lately
                "task": "tasks.liveness.heartbeat",
                "schedule": settings.heartbeat_seconds,
                "options": {"queue": control, "expires": 2 * settings.heartbeat_seconds},
            },
        },
    )
    return celery


use_metrics_dir(get_settings())
app = make_celery()
