"""Real instances for the local clouds: each one runs its boot script as a process group.

When a local cloud starts an instance, ``LocalInstances.start`` runs ``bash -c <boot script>``
in a session of its own, in an owner-only folder that stands in for the machine's disk, with
an environment that holds only what a fresh machine would have plus the local metadata
server's address (never the broker's own settings). Terminating the instance kills the whole
process tree; a spot notice flips what the metadata server answers for it. With
``runner="light"`` no process runs: ``providers.local.light`` plays every instance in-process.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from broker import clock as broker_clock
from broker.clock import Clock
from broker.private_files import private_dir
from providers.local.instance_record import LocalInstance
from providers.local.metadata import metadata_app
from providers.local.pace import SPEED_SPREAD, seconds_per_work_unit
from providers.local.process_tree import kill_trees

logger = logging.getLogger(__name__)

NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0}
"""Broker seconds between a spot notice and the reclaim, per provider."""

Runner = Literal["process", "light"]
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        logger.debug("metadata %s %s %s", self.command, self.path, code)


class LocalInstances:
    """The local clouds' machines: processes (or light in-process plays) and their metadata.

    ``serve()`` starts the metadata server on a free loopback port; ``close()`` kills every
    instance and stops it. ``speed_overrides[job_id]`` multiplies the speed of one job.
    """

    def __init__(
        self,
        instances_dir: Path | None = None,
        *,
        runner: Runner = "process",
        host: str = "127.0.0.1",
        clock: Clock | None = None,
        speed_spread: float = SPEED_SPREAD,
        kill_grace_seconds: float = 2.0,
        watch_seconds: float = 0.25,
    ) -> None:
        if runner not in ("process", "light"):
            raise ValueError(f"instance_runner must be 'process' or 'light', not {runner!r}")
        self.instances_dir = Path(instances_dir).absolute() if instances_dir else None
        self._own_dir = instances_dir is None
        self.runner = runner
        self.host = host
        self.speed_spread = speed_spread
        self.kill_grace_seconds = kill_grace_seconds
        self.speed_overrides: dict[str, float] = {}
        self._clock = clock
        self._watch_seconds = watch_seconds
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)  # notified on notices and kills
        self._instances: dict[str, LocalInstance] = {}
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self.closing = threading.Event()
        self._light: Any = None

    # -- lifecycle ----------------------------------------------------------------------

    def serve(self) -> LocalInstances:
        """Make the instances folder, start the metadata server (and the light runner)."""
        if self.instances_dir is None:
            self.instances_dir = Path(tempfile.mkdtemp(prefix="broker-instances-"))
        private_dir(self.instances_dir)
        self.closing.clear()
        self._server = make_server(
            self.host, 0, metadata_app(self), threaded=True, request_handler=_QuietHandler
        )
        serving = threading.Thread(
            target=self._server.serve_forever, name="instance-metadata", daemon=True
        )
        if self.runner == "light":
            from providers.local.light import LightRunner

            self._light = LightRunner(self)
        watching = threading.Thread(target=self._watch, name="local-instances", daemon=True)
        self._threads = [serving, watching]
        for thread in self._threads:
            thread.start()
        logger.info("instance metadata listening", extra={"metadata_url": self.metadata_url})
        return self

    def close(self) -> None:
        """Kill every instance, stop the metadata server; remove the folder if it was a temp."""
        self.stop_all()
        self.closing.set()
        with self.changed:
            self.changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._light is not None:
            self._light.close()
        self._server, self._threads, self._light = None, [], None
        if self._own_dir and self.instances_dir is not None:
            shutil.rmtree(self.instances_dir, ignore_errors=True)
            self.instances_dir = None

    def __enter__(self) -> LocalInstances:
        return self.serve()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def metadata_url(self) -> str:
        """``http://127.0.0.1:<port>``: the metadata server, valid while serving."""
        if self._server is None:
            raise RuntimeError("LocalInstances is not serving")
        return f"http://{self.host}:{self._server.server_port}"

    def instance_url(self, instance_id: str) -> str:
        """The instance's ``BROKER_METADATA_URL``."""
        return f"{self.metadata_url}/{instance_id}"

    # -- instances ----------------------------------------------------------------------

    def start(
        self,
        instance_id: str,
        provider: str,
        script: str,
        gpu: str,
        gpu_count: int,
        tags: Mapping[str, str],
    ) -> LocalInstance:
        """Run ``script`` as instance ``instance_id`` (a fresh folder, its own session)."""
        if self._server is None or self.instances_dir is None:
            raise RuntimeError("LocalInstances is not serving")
        if provider not in NOTICE_SECONDS:
            raise ValueError(f"unknown provider {provider!r}")
        if not _SAFE_ID.match(instance_id):
            raise ValueError(f"instance id {instance_id!r} cannot name a folder")
        with self._lock:
            previous = self._instances.get(instance_id)
            if previous is not None and previous.alive:
                raise ValueError(f"instance {instance_id} is already running")
        directory = self.instances_dir / instance_id
        shutil.rmtree(directory, ignore_errors=True)  # a new machine gets a new disk
        directory.mkdir(mode=0o700)
        directory.chmod(0o700)
        record = LocalInstance(
            instance_id, provider, gpu, max(int(gpu_count), 1), dict(tags), directory, script
        )
        if self.runner == "process":
            log = os.open(directory / "console.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                record.process = subprocess.Popen(
                    [shutil.which("bash") or "/bin/bash", "-c", script],
                    cwd=directory,
                    env=self.env_for(record),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own session: the kill finds all of it
                )
            finally:
                os.close(log)
        with self._lock:
            self._instances[instance_id] = record
        if self._light is not None:
            self._light.add(record)
        logger.info(
            "local instance started",
            extra={"instance_id": instance_id, "provider": provider, "runner": self.runner},
        )
        return record

    def env_for(self, record: LocalInstance) -> dict[str, str]:
        """The whole environment of an instance's boot script: nothing of the broker's."""
        base = self.instance_url(record.instance_id)
        host_path = os.environ.get("PATH", os.defpath)  # the host's tools (bash, curl, tar)
        env = {
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), host_path]),
            "HOME": str(record.directory),
            "LANG": os.environ.get("LANG") or "C.UTF-8",
            "BROKER_INSTANCE_DIR": str(record.directory),
            "BROKER_LOCAL_INSTANCE": "1",
            "BROKER_METADATA_URL": base,
            "BROKER_LOCAL_PACE_URL": f"{base}/broker-local/pace",
        }
        schedule = getattr(self._clock, "path", None)
        if schedule is not None:  # the agent holds its lease on the clock's schedule
            env["BROKER_CLOCK_SCHEDULE"] = str(schedule)
        return env

    def get(self, instance_id: str) -> LocalInstance | None:
        """The record of an instance started here, or None."""
        with self._lock:
            return self._instances.get(instance_id)

    def running(self) -> list[str]:
        """Ids of instances neither killed nor exited."""
        with self._lock:
            return [i for i, r in self._instances.items() if r.alive]

    def notice(self, instance_id: str, provider: str, reclaim_at: datetime | None = None) -> bool:
        """Announce a spot reclaim at ``reclaim_at`` (default now + the provider's window).

        Returns False for an instance not started here.
        """
        with self.changed:
            record = self._instances.get(instance_id)
            if record is None:
                return False
            if record.reclaim_at is None:
                window = timedelta(seconds=NOTICE_SECONDS.get(provider, 0.0))
                record.reclaim_at = reclaim_at or self.now() + window
                self.changed.notify_all()
        logger.info("spot notice", extra={"instance_id": instance_id, "provider": provider})
        return True

    def kill(self, instance_id: str) -> bool:
        """Kill one instance's processes (SIGTERM, a short grace, SIGKILL); False if unknown."""
        return self.kill_many([instance_id]) == 1

    def kill_many(self, instance_ids: Iterable[str]) -> int:
        """Kill several instances at once (one grace period for all); returns how many."""
        with self.changed:
            records = [
                r
                for i in instance_ids
                if (r := self._instances.get(i)) is not None and not r.killed
            ]
            for record in records:
                record.killed = True
            self.changed.notify_all()
        processes = [r.process for r in records if r.process is not None]
        if processes:
            folders = [r.directory for r in records if r.process is not None]
            kill_trees(processes, folders, self.kill_grace_seconds)
        for record in records:
            if record.process is not None:
                record.exit_code = record.process.returncode
            _wipe_disk(record.directory)
            logger.info("local instance killed", extra={"instance_id": record.instance_id})
        return len(records)

    def stop_all(self) -> int:
        """Kill every instance not killed yet (one that exited may have left a program)."""
        with self._lock:
            left = [i for i, r in self._instances.items() if not r.killed]
        return self.kill_many(left)

    # -- pace ---------------------------------------------------------------------------

    def now(self) -> datetime:
        """The clouds' time: the given clock, else the broker's."""
        return self._clock.now() if self._clock is not None else broker_clock.now()

    def scale(self) -> float:
        """Broker seconds per wall second (the given clock's scale, else the broker's)."""
        scale = getattr(self._clock, "scale", None)
        return float(scale) if scale else broker_clock.scale()

    def seconds_per_work_unit(self, instance_id: str, workload: Mapping[str, Any]) -> float:
        """Wall seconds one work unit of ``workload`` takes on this instance.

        Raises KeyError for an unknown instance, ValueError for a workload it cannot run.
        """
        record = self.get(instance_id)
        if record is None:
            raise KeyError(instance_id)
        overrides = self.speed_overrides
        job = record.job_id
        override = overrides.get(job) or next(
            (v for k, v in list(overrides.items()) if k.lower() == job.lower()), 1.0
        )
        return seconds_per_work_unit(
            workload,
            record.gpu,
            record.gpu_count,
            scale=self.scale(),
            override=override,
            spread=self.speed_spread,
        )

    # -- background ---------------------------------------------------------------------

    def _watch(self) -> None:
        """Reap instances that exit by themselves; step the light runner."""
        while not self.closing.wait(self._watch_seconds):
            with self._lock:
                records = [r for r in self._instances.values() if r.alive]
            for record in records:
                if record.process is not None and record.process.poll() is not None:
                    record.exit_code = record.process.returncode
                    logger.info(
                        "local instance exited",
                        extra={"instance_id": record.instance_id, "exit_code": record.exit_code},
                    )
            if self._light is not None:
                try:
                    self._light.step()
                except Exception:  # the runner must outlive any one failure
                    logger.exception("light instance runner failed")


def _wipe_disk(directory: Path) -> None:
    """A terminated machine's disk goes away; its console log stays (as a cloud keeps it), and
    so does the agent's log, for whoever debugs the local stack."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.name in ("console.log", "agent.log"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
