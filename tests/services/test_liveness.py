"""``LivenessMonitor``: what the probes' answers mean, on a clock the test moves (a real worker
answering through Celery is in tests/api/test_health.py)."""

from __future__ import annotations

from collections.abc import Mapping

from broker.services.liveness import LivenessMonitor

TIMEOUT = 60.0


class Workers:
    """The answers a probe gets: hostname -> beat age; ``down`` makes the probe raise."""

    def __init__(self) -> None:
        self.answers: dict[str, float | None] = {}
        self.down = False

    def __call__(self) -> Mapping[str, float | None]:
        if self.down:
            raise ConnectionError("the Celery broker does not answer")
        return dict(self.answers)


class Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor() -> tuple[LivenessMonitor, Workers, Wall]:
    workers, wall = Workers(), Wall()
    return LivenessMonitor(workers, interval=10.0, timeout=TIMEOUT, monotonic=wall), workers, wall


def test_nothing_heard_is_degraded() -> None:
    live, _, _ = monitor()
    live.probe_once()
    view = live.view()
    assert (view.workers_alive, view.worker_age, view.beat_age) == (0, None, None)
    assert not view.beat_alive and not view.ok


def test_answering_workers_are_alive_and_the_freshest_beat_age_counts() -> None:
    live, workers, wall = monitor()
    workers.answers = {"w1@a": 30.0, "w2@b": 4.0, "w3@c": None}
    live.probe_once()
    wall.now += 1
    view = live.view()
    assert view.workers_alive == 3
    assert view.worker_age == 1.0
    assert view.beat_age == 5.0
    assert view.ok


def test_a_worker_silent_past_the_timeout_is_dead_and_beat_too() -> None:
    live, workers, wall = monitor()
    workers.answers = {"w1@a": 0.0, "w2@b": 0.0}
    live.probe_once()
    wall.now += 30
    workers.answers = {"w1@a": 30.0}  # w2 stopped answering; no heartbeat reached w1 since
    live.probe_once()
    wall.now += 29
    assert live.view().workers_alive == 2 and live.view().ok
    wall.now += 2  # w2 and beat silent for 61 s
    view = live.view()
    assert view.workers_alive == 1
    assert not view.beat_alive and not view.ok


def test_a_failed_probe_changes_nothing_so_silence_grows() -> None:
    live, workers, wall = monitor()
    workers.answers = {"w1@a": 0.0}
    live.probe_once()
    workers.down = True
    wall.now += 20
    live.probe_once()
    assert live.view().ok and live.view().worker_age == 20.0
    wall.now += 41
    live.probe_once()
    assert live.view().workers_alive == 0 and not live.view().ok


def test_the_thread_probes_until_stopped() -> None:
    workers = Workers()
    workers.answers = {"w1@a": 0.5}
    live = LivenessMonitor(workers, interval=0.05, timeout=TIMEOUT)
    live.start(wait_seconds=2.0)
    try:
        assert live.view().ok
    finally:
        live.stop()
    assert live._thread is not None and not live._thread.is_alive()
