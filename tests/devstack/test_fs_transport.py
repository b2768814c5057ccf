"""The embedded Celery transport: messages cross processes whole, in order of sending."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from kombu import Connection, Queue

from broker.devstack.fs_transport import TRANSPORT_PATH


def _options(folder: Path) -> dict[str, object]:
    queue = folder / "queue"
    queue.mkdir(exist_ok=True)
    return {
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "control_folder": str(folder / "control"),
        "polling_interval": 0.01,
    }


def _produce(folder: str, count: int) -> None:
    with Connection(
        "filesystem://", transport=TRANSPORT_PATH, transport_options=_options(Path(folder))
    ) as conn:
        queue = conn.SimpleQueue(Queue("q", routing_key="q"))
        for i in range(count):
            queue.put({"n": i, "pad": "x" * 500_000})
        queue.close()


def test_messages_from_another_process_arrive_whole(tmp_path: Path) -> None:
    count = 100
    producer = multiprocessing.get_context("spawn").Process(
        target=_produce, args=(str(tmp_path), count)
    )
    producer.start()
    seen: list[int] = []
    with Connection(
        "filesystem://", transport=TRANSPORT_PATH, transport_options=_options(tmp_path)
    ) as conn:
        queue = conn.SimpleQueue(Queue("q", routing_key="q"))
        while len(seen) < count:
            message = queue.get(timeout=30)
            assert message.payload["pad"] == "x" * 500_000
            seen.append(message.payload["n"])
            message.ack()
        queue.close()
    producer.join(timeout=30)
    assert sorted(seen) == list(range(count))
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "queue").iterdir())
