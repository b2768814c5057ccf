"""Launch requests reach the workers' queue: batched per window, or one task per job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Queue

from broker.services import dispatch
from broker.settings import get_settings


@pytest.fixture
def queue_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Point the API's Celery client at a file-system queue of its own; ``queue_in(window)``
    sets BROKER_LAUNCH_BATCH_SECONDS."""

    def _configure(window: float) -> None:
        monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path))
        monkeypatch.delenv("BROKER_CELERY_BROKER_URL", raising=False)
        monkeypatch.setenv("BROKER_LAUNCH_BATCH_SECONDS", str(window))
        get_settings.cache_clear()
        dispatch._client.cache_clear()

    yield _configure
    assert dispatch.flush_launches()
    monkeypatch.undo()
    get_settings.cache_clear()
    dispatch._client.cache_clear()


def _sent() -> list[tuple[str, object]]:
    """(task name, args) of every message waiting in the configured queue, sorted.

    Sorted because kombu's file-system queue orders messages by a millisecond stamp and
    then a random uuid: two published in the same millisecond come back in either order."""
    settings = get_settings()
    sent = []
    with Connection(
        settings.resolved_celery_broker_url,
        transport=settings.celery_transport,
        transport_options=settings.celery_transport_options(),
    ) as connection:
        queue = connection.SimpleQueue(Queue(settings.celery_queue))
        while True:
            try:
                message = queue.get(timeout=0.1)
            except queue.Empty:
                break
            args, _kwargs, _embed = message.payload
            sent.append((message.headers["task"], args))
            message.ack()
        queue.close()
    return sorted(sent, key=repr)


def test_launches_admitted_in_one_window_go_as_one_task_per_eight_jobs(queue_in) -> None:
    queue_in(0.6)
    ids = [f"job_{n:02d}" for n in range(10)]
    for job_id in ids:
        dispatch.enqueue_launch(job_id)
    assert dispatch.flush_launches()
    assert _sent() == [
        ("tasks.control_loop.launch_many", [ids[:8]]),
        ("tasks.control_loop.launch_many", [ids[8:]]),
    ]
    dispatch.enqueue_launch("job_alone")
    time.sleep(0.05)  # still inside its window
    assert _sent() == []
    assert dispatch.flush_launches()
    assert _sent() == [("tasks.control_loop.launch", ["job_alone"])]


def test_without_a_window_each_launch_is_published_before_the_call_returns(queue_in) -> None:
    queue_in(0)
    dispatch.enqueue_launch("job_a")
    dispatch.enqueue_launch("job_b")
    assert _sent() == [
        ("tasks.control_loop.launch", ["job_a"]),
        ("tasks.control_loop.launch", ["job_b"]),
    ]


def test_a_queue_that_is_down_loses_no_admitted_job_it_logs_the_tick_will_launch(
    queue_in, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    queue_in(0.01)
    monkeypatch.setenv("BROKER_CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # nobody listens
    get_settings.cache_clear()
    dispatch._client.cache_clear()
    with caplog.at_level("WARNING", logger="broker.services.dispatch"):
        dispatch.enqueue_launch("job_x")
        dispatch.enqueue_launch("job_y")
        assert dispatch.flush_launches(timeout=30)
    assert "could not enqueue launch, tick will" in caplog.text
    dispatch.enqueue_launch("job_z")  # the publisher thread lives on
    assert dispatch.flush_launches(timeout=30)
