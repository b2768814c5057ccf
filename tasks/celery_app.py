"""The Celery application: broker URL from settings, late acks, beat schedule."""

from __future__ import annotations

from celery import Celery

from broker.settings import get_settings


def make_celery() -> Celery:
    """A Celery app configured from the broker's settings."""
    settings = get_settings()
    celery = Celery("broker", include=["tasks.jobs"])
    celery.conf.update(
        broker_url=settings.resolved_celery_broker_url,
        broker_transport=settings.celery_transport,
        broker_transport_options=settings.celery_transport_options(),
        result_backend=settings.celery_result_backend,
        task_ignore_result=settings.celery_result_backend is None,
        task_default_queue=settings.celery_queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "tick": {"task": "tasks.jobs.tick", "schedule": settings.tick_seconds},
            "reconcile": {"task": "tasks.jobs.reconcile", "schedule": settings.reconcile_seconds},
            "refresh-prices": {
                "task": "tasks.jobs.refresh_prices",
                "schedule": settings.refresh_prices_seconds,
            },
        },
    )
    return celery


app = make_celery()
