"""Sending work to the Celery workers by task name (the API never imports ``tasks``)."""

from __future__ import annotations

import logging
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


def enqueue_launch(job_id: str) -> None:
    """Ask a worker to launch a job now; the next tick would otherwise pick it up."""
    try:
        _client().send_task("tasks.control_loop.launch", args=[job_id], queue=_queue())
    except Exception as error:  # the queue being down must not fail an admitted job
        log.warning("could not enqueue launch, tick will: %s", error, extra={"job_id": job_id})


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
