"""Light instances: one thread plays every local instance in-process instead of a process each.

For benches that run hundreds of jobs at once on a small machine. Each light instance reads
the attempt's address and token from the ``export``s of its boot script, fetches the run spec
as the agent does, advances work at the instance's pace (the same as the pace endpoint gives a
real program), uploads a small checkpoint tar.gz through the broker's presigned URLs every
``checkpoint_seconds`` broker seconds and when done, reports progress every ``report_seconds``
of the run spec, answers a spot notice like the agent (last checkpoint, then ``/preempted``)
and ends with ``/exit`` 0. What it skips: the program, its logs, the lease backstop.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from providers.boot import script_exports

if TYPE_CHECKING:
    from providers.local.instance_record import InstanceBook, LocalInstance

logger = logging.getLogger(__name__)

_ENDED = (401, 404, 409)  # token refused or attempt over: the play is over too


@dataclass
class _Play:
    record: LocalInstance
    api_url: str
    attempt_id: str
    token: str
    spec: dict[str, Any] | None = None
    work: float = 0.0
    ready_at: float = 0.0  # wall (monotonic) time the restore is over and work starts
    last_step: float = 0.0
    last_report: float = 0.0
    last_checkpoint: float = 0.0
    done: bool = False

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def url(self, action: str) -> str:
        return f"{self.api_url.rstrip('/')}/v1/attempts/{self.attempt_id}/{action}"


class LightRunner:
    """Plays every light instance of ``instances``; ``step()`` advances them all to now."""

    def __init__(
        self,
        instances: InstanceBook,
        *,
        restore_seconds: float = 360.0,
        checkpoint_seconds: float = 1800.0,
        noise: float = 0.03,
        seed: int = 7,
        client: httpx.Client | None = None,
    ) -> None:
        self.instances = instances
        self.restore_seconds = restore_seconds  # broker seconds before work starts
        self.checkpoint_seconds = checkpoint_seconds  # broker seconds between checkpoints
        self.noise = noise
        self._rng = np.random.default_rng(seed)
        self._http = client or httpx.Client(timeout=10)
        self._plays: dict[str, _Play] = {}
        self._lock = threading.Lock()

    def add(self, record: LocalInstance) -> None:
        """Start playing a new instance (ignored, with a log line, if its script is not ours)."""
        exports = script_exports(record.script)
        api_url, attempt_id, token = (
            exports.get(name, "")
            for name in ("BROKER_API_URL", "BROKER_ATTEMPT_ID", "BROKER_AGENT_TOKEN")
        )
        if not (api_url and attempt_id and token):
            logger.warning(
                "light instance: the boot script exports no attempt; nothing runs",
                extra={"instance_id": record.instance_id},
            )
            return
        play = _Play(record, api_url, attempt_id, token)
        with self._lock:
            self._plays[record.instance_id] = play
        self._console(play, "light instance: playing the agent in-process")

    def step(self) -> int:
        """Advance every play; returns how many are still going."""
        with self._lock:
            plays = list(self._plays.items())
        for instance_id, play in plays:
            if not play.done and not play.record.killed:
                try:
                    self._advance(play, time.monotonic())
                except (httpx.HTTPError, ValueError, KeyError) as error:
                    logger.warning(
                        "light instance step failed: %s",
                        error,
                        extra={"instance_id": instance_id, "attempt_id": play.attempt_id},
                    )
            if play.done or play.record.killed:
                with self._lock:
                    self._plays.pop(instance_id, None)
        return len(self._plays)

    def close(self) -> None:
        """Drop every play and close the HTTP client."""
        with self._lock:
            self._plays.clear()
        self._http.close()

    def _advance(self, play: _Play, now: float) -> None:
        if play.spec is None and not self._fetch_spec(play, now):
            return
        spec = play.spec
        assert spec is not None
        scale = self.instances.scale()  # now: the stack may have lowered it since the spec
        if play.record.reclaim_at is not None:
            self._checkpoint(play)
            self._post(play, "preempted", {"reason": "spot interruption notice"})
            self._finish(play, "light instance: spot notice; checkpoint saved, preempted")
            return
        start = max(play.last_step, play.ready_at)
        if now > start:
            pace = self.instances.seconds_per_work_unit(play.record.instance_id, spec["workload"])
            jitter = max(0.0, 1.0 + float(self._rng.normal(0.0, self.noise)))
            play.work = min(play.work + (now - start) / pace * jitter, float(spec["total_work"]))
        play.last_step = now
        if play.work >= float(spec["total_work"]):
            if self._checkpoint(play):
                self._post(play, "exit", {"exit_code": 0, "tail": "light instance: done"})
                self._finish(play, f"light instance: finished at {play.work:.6g}")
        elif now - play.last_checkpoint >= self.checkpoint_seconds / scale:
            self._checkpoint(play)
        elif now - play.last_report >= float(spec.get("report_seconds") or 1.0):
            self._report(play, None)

    def _fetch_spec(self, play: _Play, now: float) -> bool:
        response = self._http.get(play.url("run"), headers=play.headers)
        if response.status_code in _ENDED:
            self._finish(play, f"light instance: run spec refused ({response.status_code})")
            return False
        response.raise_for_status()
        spec = response.json()
        scale = self.instances.scale()
        play.spec = spec
        play.work = float(spec.get("start_work") or 0.0)
        play.ready_at = now + self.restore_seconds / scale
        play.last_step = play.last_report = play.last_checkpoint = now
        return True

    def _checkpoint(self, play: _Play) -> bool:
        """Upload a checkpoint at the current work and report it; False if the play ended."""
        reply = self._post(play, "checkpoints", {"work_done": play.work})
        if reply is None:
            return False
        self._http.put(reply["url"], content=_checkpoint_archive(play.work)).raise_for_status()
        play.last_checkpoint = time.monotonic()
        return self._report(play, reply["key"])

    def _report(self, play: _Play, key: str | None) -> bool:
        ack = self._post(play, "progress", {"work_done": play.work, "checkpoint_key": key})
        play.last_report = time.monotonic()
        if ack is not None and ack.get("should_stop"):
            self._finish(play, "light instance: the broker says stop")
        return ack is not None

    def _post(self, play: _Play, action: str, body: dict[str, Any]) -> dict[str, Any] | None:
        response = self._http.post(play.url(action), json=body, headers=play.headers)
        if response.status_code in _ENDED:
            self._finish(play, f"light instance: {action} refused ({response.status_code})")
            return None
        response.raise_for_status()
        return dict(response.json())

    def _finish(self, play: _Play, line: str) -> None:
        play.done = True
        self._console(play, line)

    def _console(self, play: _Play, line: str) -> None:
        path = play.record.directory / "console.log"
        try:
            with path.open("a") as handle:
                handle.write(line + "\n")
        except OSError:
            logger.debug("no console for %s", play.record.instance_id)


def _checkpoint_archive(work_done: float) -> bytes:
    """A small tar.gz holding the work done, as the agent would upload a checkpoint folder."""
    data = json.dumps({"work_done": work_done}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("work.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
