"""The broker's Celery tasks: each validates its arguments and calls one service function
(the runner's, the price refresh, or the spot model's refit)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery import signals
from kombu.exceptions import ChannelError

from broker import clock
from broker.db.engine import open_session
from broker.faults import fault_point
from broker.heap import freeze_heap
from broker.services.dispatch import LAUNCH_BATCH_MAX
from broker.services.lifecycle import ToTerminate
from broker.services.metrics import TICK_SECONDS
from broker.services.price_refresh import refresh
from broker.services.spot_model import refit
from broker.services.wiring import get_runner
from broker.settings import get_settings
from providers.base import TransientError
from tasks.celery_app import app

log = logging.getLogger(__name__)


@signals.worker_process_init.connect
def _warm_up(**_: Any) -> None:
    """Each pool process builds its runner (cloud clients, the planning synced with the stored
    prices) before its first task, not during it: cold, a fresh worker's first launches and
    ticks took seconds each, hours of broker time at a demo's scale."""
    try:
        runner = get_runner()
        with open_session() as session:
            runner.planning.sync(session, force=True)
        freeze_heap()
    except Exception as error:  # noqa: BLE001 - tasks build what is missing; the worker runs on
        log.warning("worker process not warmed up: %s", error)


@app.task(autoretry_for=(TransientError,), retry_backoff=True, max_retries=5)
def launch(job_id: str, market: str | None = None) -> str | None:
    """Launch a job's next plan (or complete an interrupted launch). A launch without a
    market (admission's, the tick's) lets a waiting job due sooner go first."""
    runner = get_runner()
    if market is None:
        attempt_id = runner.launch_urgent_first(str(job_id))
    else:
        attempt_id = runner.launch(str(job_id), market)
    fault_point("before_ack")
    return attempt_id


@app.task
def launch_many(job_ids: list[str]) -> int:
    """Admission's launches of the jobs admitted in one short window (``dispatch``); a job
    whose launch met a transient cloud error gets a ``launch`` task of its own, which
    retries with backoff. Returns how many did."""
    retry = get_runner().launch_admitted([str(job_id) for job_id in job_ids])
    for job_id in retry:
        launch.delay(job_id)
    fault_point("before_ack")
    return len(retry)


@app.task
def launch_due(job_ids: list[str]) -> int:
    """The tick's launches of waiting jobs (at most ``LAUNCH_BATCH_MAX``, least slack first);
    a transient cloud error leaves its job to the next tick. Returns how many met one."""
    failed = get_runner().launch_due([str(job_id) for job_id in job_ids])
    fault_point("before_ack")
    return len(failed)


@app.task(autoretry_for=(TransientError,), retry_backoff=True, max_retries=5)
def terminate(instances: list[dict[str, str]]) -> int:
    """Terminate the instances of attempts that ended (e.g. on cancel)."""
    items = [ToTerminate(**item) for item in instances]
    get_runner().terminate(items)
    return len(items)


@app.task
def observe(attempt_id: str) -> None:
    """Poll one attempt: spend, preemption, completion, policy."""
    with TICK_SECONDS.labels("observe").time():
        get_runner().observe(str(attempt_id))
    fault_point("before_ack")


@app.task
def observe_batch(attempt_ids: list[str], tick: str | None = None) -> int:
    """Poll a batch of attempts: one describe per provider and region, then each decided;
    with ``tick`` (the sending tick's broker time, ISO 8601) only those no batch of that tick
    observed yet."""
    at = datetime.fromisoformat(tick) if tick else None
    with TICK_SECONDS.labels("observe_batch").time():
        regions = get_runner().observe_many([str(a) for a in attempt_ids], tick=at)
    fault_point("before_ack")
    return regions


def batches(items: list[str], size: int) -> list[list[str]]:
    """``items`` in consecutive batches of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), max(1, size))]


def waiting_tasks(queue: str | None = None) -> int:
    """Messages waiting in ``queue`` (default: the workers' main queue; a passive declare:
    every transport counts them); 0 when there is no such queue (Redis keeps none while it
    is empty) or when it cannot tell."""
    try:
        with app.connection_for_write() as connection:
            queue = queue or get_settings().celery_queue
            declared = connection.default_channel.queue_declare(queue, passive=True)
            return int(declared.message_count)
    except ChannelError as error:
        if str(getattr(error, "reply_code", "")) != "404":  # 404: no such queue yet
            log.warning("could not count the waiting tasks: %s", error)
        return 0
    except Exception as error:  # a count to pace the fan-out, never a reason to skip the tick
        log.warning("could not count the waiting tasks: %s", error)
        return 0


@app.task
def tick() -> dict[str, int]:
    """Beat: renew (or stop) the spend leases about to end, then fan out the live attempts'
    observations and the waiting jobs' launches in batches, each unless its queue still
    holds the last round."""
    with TICK_SECONDS.labels("tick").time():
        runner = get_runner()
        renewed = runner.sweep_leases()
        due = runner.due()
        # When the workers have not taken the last round, another one only piles stale
        # duplicates on it (launches among them expire unseen): skip it. The loop then lags,
        # its lag log says so and the embedded stack slows its clock.
        # Observations and launches are paced apart (their own queues): a backlog of
        # launches must not stop the watching of what runs, nor the other way round.
        settings = get_settings()
        rounds = batches(due.observe, settings.observe_batch_size)
        if rounds and waiting_tasks(settings.celery_observe_queue) >= len(rounds):
            rounds, due.observe = [], []
        # Waiting jobs go in batches, least slack first: one task per job put a tick's
        # hundreds of launches (most of them stale repeats of the last tick's) ahead of
        # admission's in the queue.
        launches = batches(due.launch, LAUNCH_BATCH_MAX)
        if launches and waiting_tasks() >= len(launches):
            launches, due.launch = [], []
        # A tick's fan-out is stale a few ticks later: drop what no worker took by then, so a
        # slow worker does not work through a backlog of duplicates.
        expires = 3 * runner.tick_seconds + 5.0
        tick_at = clock.now().isoformat()
        for batch in rounds:
            observe_batch.apply_async((batch, tick_at), expires=expires)
        for batch in launches:
            launch_due.apply_async((batch,), expires=expires)
    return {"leases": renewed, "observe": len(due.observe), "launch": len(due.launch)}


@app.task
def reconcile() -> dict[str, int]:
    """Beat: terminate orphans, mark attempts whose instance is gone."""
    report = get_runner().reconcile()
    return {
        "orphans": len(report.orphans_terminated),
        "ended": len(report.ended_terminated),
        "gone": len(report.attempts_marked_gone),
    }


@app.task
def refresh_prices() -> dict[str, object]:
    """Beat: refresh spot prices from the clouds; a failure keeps the last good catalog."""
    runner = get_runner()
    return refresh(runner.planning, runner.engine, clock.now())


@app.task
def refit_spot_model() -> int:
    """Beat: refit the shared spot model from the traces and the attempts; rows changed."""
    runner = get_runner()
    with open_session(runner.engine) as session:
        return refit(session, clock.now(), runner.planning.offers)
