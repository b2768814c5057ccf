"""Sending work to the Celery workers by task name (the API never imports ``tasks``)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict
from functools import lru_cache

from celery import Celery

from broker.services.lifecycle import ToTerminate
from broker.settings import Settings, get_settings

log = logging.getLogger(__name__)


def celery_client(settings: Settings) -> Celery:
    """A Celery app that only talks to the workers (sends tasks, asks them), never runs tasks."""
    client = Celery("broker-client", broker=settings.resolved_celery_broker_url)
    client.conf.broker_transport = settings.celery_transport
    client.conf.broker_transport_options = settings.celery_transport_options()
    return client


@lru_cache
def _client() -> Celery:
    return celery_client(get_settings())


def _queue() -> str:
    return get_settings().celery_queue


# jobs per launch_many (or the tick's launch_due) task: a burst still spreads over the workers
LAUNCH_BATCH_MAX = 8


class LaunchBatcher:
    """Admission's launch requests, published by one thread as a task per short window.

    A publish costs the API about 1-2 ms of CPU (``bench/api_submit.py``, file-system, Redis
    and AMQP transports alike); under a burst of submissions one ``launch_many`` message
    carries the jobs admitted in the same ``launch_batch_seconds``. A request that is never
    published (the process ended first, the queue is down) is not lost: every tick launches
    the queued jobs that nothing launches.
    """

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._publishing = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, job_id: str) -> None:
        """Publish a launch of ``job_id`` within the window (at once, here, with no window)."""
        if get_settings().launch_batch_seconds <= 0:
            _publish_launches([job_id])
            return
        with self._changed:
            self._pending.append(job_id)
            if self._thread is None or not self._thread.is_alive():  # first use, or a fork
                self._thread = threading.Thread(
                    target=self._run, name="launch-publisher", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every launch added so far is published (or failed to); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending or self._publishing:
                left = deadline - time.monotonic()
                if left <= 0 or not self._changed.wait(left):
                    return not (self._pending or self._publishing)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                self._publishing = True
            time.sleep(get_settings().launch_batch_seconds)  # let the burst gather
            with self._changed:
                batch, self._pending = self._pending, []
            try:
                for start in range(0, len(batch), LAUNCH_BATCH_MAX):
                    _publish_launches(batch[start : start + LAUNCH_BATCH_MAX])
            finally:
                with self._changed:
                    self._publishing = bool(self._pending)
                    self._changed.notify_all()


def _publish_launches(job_ids: list[str]) -> None:
    try:
        if len(job_ids) == 1:
            _client().send_task("tasks.control_loop.launch", args=job_ids, queue=_queue())
        else:
            _client().send_task("tasks.control_loop.launch_many", args=[job_ids], queue=_queue())
    except Exception as error:  # the queue being down must not fail an admitted job
        log.warning(
            "could not enqueue launch, tick will: %s", error, extra={"job_id": ",".join(job_ids)}
        )


LAUNCHES = LaunchBatcher()


def enqueue_launch(job_id: str) -> None:
    """Ask a worker to launch a job now (within ``launch_batch_seconds``); the next tick
    would otherwise pick it up."""
    LAUNCHES.add(job_id)


def flush_launches(timeout: float = 10.0) -> bool:
    """Wait until the launches asked for so far are published (tests, shutdown)."""
    return LAUNCHES.flush(timeout)


def enqueue_terminate(instances: list[ToTerminate]) -> None:
    """Ask a worker to terminate ended attempts' instances; reconcile catches any miss."""
    if not instances:
        return
    try:
        _client().send_task(
            "tasks.control_loop.terminate", args=[[asdict(i) for i in instances]], queue=_queue()
        )
    except Exception as error:
        log.warning("could not enqueue terminate, reconcile will: %s", error)
