"""The whole broker on one machine: API, Celery worker and beat, local clouds and their instances.

Used by ``broker demo``, ``broker serve`` and the end-to-end tests. The API and the Celery
worker (with beat inside it) run as subprocesses, as in production; the local clouds and the
market replay run in this process, and every instance they launch runs its boot script (the
agent, then the job's command) as a process group of its own under ``<data dir>/instances``
(or, with ``instance_runner="light"``, as an in-process play of the agent). Every broker
process reads the same ``BROKER_*`` environment, so they share the database, the Celery
transport and the scaled clock's epoch; instances get none of it.

A supervisor thread starts a worker again when it exits unexpectedly (with a growing pause
if it keeps dying). No child outlives the stack: each gets SIGTERM when the stack's process
dies (``die_with_parent``), a worker's pool and its embedded beat when the worker dies
(billiard, ``tasks.liveness``).

The clock is a schedule file in the data folder (``broker.clock.ScheduleClock``) that every
process, the instances' agents included, reads: when the workers' lag log says the control
loop runs late in broker time, the supervisor lowers the scale there (``pacing``), so a busy
machine gets a slower demo rather than decisions on stale observations.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import clock
from broker.clock import ScheduleClock, start_schedule
from broker.devstack.pacing import Pacer
from broker.devstack.processes import (
    api_argv,
    die_with_parent,
    free_port,
    kill_group,
    wait_until_healthy,
)
from broker.private_files import AGENT_SECRET_FILE, kept_secret, private_dir
from broker.settings import get_settings

if TYPE_CHECKING:
    from providers.local.instances import Runner

log = logging.getLogger(__name__)

# Spend leases on the scaled clock: 20 ticks (20 wall seconds at a 1 s tick), against the
# production default of 6, as a loaded laptop's loop can lag 5-10 wall seconds (a demo run
# beside six CPU-bound processes lagged 1,465 broker seconds at x300, 6 ticks' lease being
# 1,800 s, and two tight jobs lost their attempts to lapsed leases, then their deadlines).
LEASE_TICKS = 20.0


class EmbeddedStack:
    """``with EmbeddedStack(folder) as stack:`` -> ``stack.api_url``, ``stack.admin_token``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        scale: float = 600.0,
        tick_seconds: float = 1.0,
        reconcile_seconds: float = 5.0,
        database_url: str | None = None,
        celery_broker_url: str | None = None,
        concurrency: int = 2,
        workers: int = 1,
        fault_rate: float = 0.0,
        market_offset_seconds: float = 0.0,
        instance_runner: Runner = "process",
        extra_env: Mapping[str, str] | None = None,
        log_level: str = "warning",
        admin_token: str | None = None,
        agent_secret: str | None = None,
        api_port: int | None = None,
        epoch: datetime | None = None,
        supervise: bool = True,
        min_scale: float | None = None,
        lag_limit_seconds: float = 600.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.scale = scale
        self.tick_seconds = tick_seconds
        self.reconcile_seconds = reconcile_seconds
        self.database_url = database_url or f"sqlite:///{self.data_dir / 'broker.db'}"
        self.celery_broker_url = celery_broker_url
        self.concurrency = concurrency
        self.workers = workers
        self.fault_rate = fault_rate
        self.market_offset_seconds = market_offset_seconds
        self.instance_runner = instance_runner
        self.extra_env = dict(extra_env or {})
        self.log_level = log_level
        self.admin_token = admin_token or "adm_" + secrets.token_urlsafe(24)
        # None: the one kept in the data folder, so a restarted stack accepts the tokens of
        # attempts launched before (and derives them again for a retried launch).
        self.agent_secret = agent_secret
        self.api_port = api_port or free_port()
        self.epoch = epoch
        # The supervisor lowers the scale (halving it) while the control loop lags more
        # than lag_limit_seconds of broker time, down to min_scale (default: a quarter).
        self.min_scale = min(scale, scale / 4 if min_scale is None else min_scale)
        self.lag_limit_seconds = lag_limit_seconds
        self.schedule_path = self.data_dir / "clock_schedule"
        self.lag_log_path = self.data_dir / "loop_lag"
        self.pacer: Pacer | None = None
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.cloud: Any = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._saved_env: dict[str, str | None] = {}
        self.env: dict[str, str] = {}
        self.supervise = supervise
        self.restarts: dict[str, int] = {}  # worker name -> times the supervisor restarted it
        self._lock = threading.RLock()  # the supervisor and restart_worker change _processes
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._started_at: dict[str, float] = {}
        self._pause: dict[str, float] = {}

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> EmbeddedStack:
        """Bring everything up; returns once the API answers."""
        from providers.local.stack import LocalCloud

        private_dir(self.data_dir)
        self._stopping.clear()
        epoch = self.epoch or datetime.now(UTC)
        start_schedule(self.schedule_path, self.scale, epoch)
        self.lag_log_path.unlink(missing_ok=True)
        scaled = ScheduleClock(self.schedule_path)
        clock.set_clock(scaled)
        self.pacer = pacer = Pacer(
            self.schedule_path,
            self.lag_log_path,
            floor=self.min_scale,
            limit_seconds=self.lag_limit_seconds,
            tick_seconds=self.tick_seconds,
        )
        self.cloud = LocalCloud(
            fault_rate=0.0,
            market_offset_seconds=self.market_offset_seconds,
            clock=scaled,
            market_interval_seconds=0.25,
            instances_dir=self.data_dir / "instances",
            instance_runner=self.instance_runner,
        )
        try:
            self.cloud.start()
            self.env = {
                **self.cloud.env,
                "BROKER_DATA_DIR": str(self.data_dir),
                "BROKER_DATABASE_URL": self.database_url,
                "BROKER_ADMIN_TOKEN": self.admin_token,
                "BROKER_AGENT_SECRET": self.agent_secret
                or kept_secret(self.data_dir / AGENT_SECRET_FILE),
                "BROKER_CLOCK_SCALE": str(self.scale),
                "BROKER_CLOCK_EPOCH": epoch.isoformat(),
                "BROKER_CLOCK_SCHEDULE": str(self.schedule_path),
                "BROKER_LOOP_LAG_FILE": str(self.lag_log_path),
                "BROKER_TICK_SECONDS": str(self.tick_seconds),
                "BROKER_RECONCILE_SECONDS": str(self.reconcile_seconds),
                "BROKER_API_URL": self.api_url,
                **self.agent_timing(),
                **self.market_timing(),
                **self.extra_env,
            }
            if self.celery_broker_url:
                self.env["BROKER_CELERY_BROKER_URL"] = self.celery_broker_url
            self._apply_env()
            from broker.db.engine import create_schema, get_engine

            create_schema(get_engine())
            self._spawn_api()
            for number in range(1, self.workers + 1):
                self._spawn_worker(number)
            self._wait_for_api()
            # Booting workers start their first tasks late: judge the loop from here on.
            pacer.calm_until = time.time() + 5.0
            self.cloud.faults.rate = self.fault_rate
            if self.supervise:
                self._supervisor = threading.Thread(
                    target=self._supervise, name="stack-supervisor", daemon=True
                )
                self._supervisor.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the worker and the API, then the clouds and their instances; restore the
        environment."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
            self._supervisor = None
        for name in sorted(self._processes, key=lambda n: n == "api"):  # workers first
            process = self._processes.pop(name, None)
            if process is None:
                continue
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)
            kill_group(process)  # stragglers too
        if self.cloud is not None:
            self.cloud.stop()
            self.cloud = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}
        from broker.db import engine as db

        get_settings.cache_clear()
        db.get_engine.cache_clear()
        clock.set_clock(None)

    def __enter__(self) -> EmbeddedStack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- parts ----------------------------------------------------------------------------

    def _apply_env(self) -> None:
        from broker.db import engine as db
        from broker.services import quoting as planning
        from broker.services import wiring

        for key, value in self.env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        get_settings.cache_clear()
        db.get_engine.cache_clear()
        planning.get_planning.cache_clear()
        wiring.get_runner.cache_clear()

    def _log(self, name: str) -> Any:
        return open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._started_at[name] = time.monotonic()
        with self._log(name) as output:
            self._processes[name] = subprocess.Popen(
                argv,
                env={**os.environ, **self.env},
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=str(Path(__file__).resolve().parents[2]),
                preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads touch it before exec)
                start_new_session=True,  # its own process group: pool children go with it
            )

    def _spawn_api(self) -> None:
        self._spawn("api", api_argv(self.api_port, self.log_level))

    def _spawn_worker(self, number: int = 1) -> None:
        """Worker 1 also runs beat; more workers (``workers=``) only consume."""
        name = "worker" if number == 1 else f"worker-{number}"
        beat = ["--beat", "--schedule", str(self.data_dir / "celerybeat-schedule")]
        self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                *(beat if number == 1 else []),
                "--hostname",
                f"{name}@%h",
                "--concurrency",
                str(self.concurrency),
                "--loglevel",
                self.log_level,
                "--without-gossip",
                "--without-mingle",
            ],
        )

    def _wait_for_api(self) -> None:
        wait_until_healthy(
            self.api_url, self._processes, lambda name: f"see {self.data_dir}/{name}.log"
        )

    def agent_timing(self) -> dict[str, str]:
        """Agent silence, boot grace and report interval in broker seconds, wide enough on
        the scaled clock that a loaded laptop does not see healthy agents as lost; spend
        leases of ``LEASE_TICKS`` ticks, so that a loop lagging a few wall seconds before
        the pacer slows the clock does not let leases lapse (each lapse costs a restart)."""
        patient = max(600.0, 30.0 * self.scale)
        return {
            "BROKER_AGENT_SILENCE_SECONDS": f"{patient:g}",
            "BROKER_AGENT_BOOT_GRACE_SECONDS": f"{patient:g}",
            "BROKER_AGENT_REPORT_SECONDS": f"{max(60.0, 1.0 * self.scale):g}",
            "BROKER_LEASE_TICKS": f"{LEASE_TICKS:g}",
        }

    def market_timing(self) -> dict[str, str]:
        """The price refresh and the spot model's refit at their production pace in broker
        time (hourly, every 10 minutes), within what a laptop can run: at least 30 and 5
        wall seconds apart (a refresh against the local clouds takes ~3 s of CPU)."""
        return {
            "BROKER_REFRESH_PRICES_SECONDS": f"{max(30.0, 3600.0 / self.scale):g}",
            "BROKER_SPOT_MODEL_REFIT_SECONDS": f"{max(5.0, 600.0 / self.scale):g}",
        }

    # -- looking in -------------------------------------------------------------------------

    @property
    def speed_overrides(self) -> dict[str, float]:
        """Per job id: how much faster (>1) or slower (<1) its instances run than predicted."""
        if self.cloud is None:
            raise RuntimeError("the stack is not running")
        overrides: dict[str, float] = self.cloud.instances.speed_overrides
        return overrides

    def worker_alive(self) -> bool:
        """Whether the Celery worker process is still running."""
        process = self._processes.get("worker")
        return process is not None and process.poll() is None

    def restart_worker(self, **env: str) -> None:
        """Kill the worker (as a crash would) and start a new one, with ``env`` changed."""
        with self._lock:
            process = self._processes.pop("worker", None)
            if process is not None:
                kill_group(process)
            self.env.update(env)
            self._spawn_worker()

    @property
    def effective_scale(self) -> float:
        """Broker seconds per wall second now (the scale the stack started with, or lower)."""
        return clock.scale()

    @property
    def scale_changes(self) -> list[tuple[datetime, float]]:
        """When (broker time) the supervisor lowered the scale, and to what."""
        changes = self.pacer.changes if self.pacer is not None else []
        return [(datetime.fromtimestamp(broker, UTC), scale) for _, broker, scale in changes]

    def _supervise(self) -> None:
        """Every half second: start again each worker that exited while the stack runs; lower
        the clock's scale if the control loop lags."""
        while not self._stopping.wait(0.5):
            try:
                with self._lock:
                    for name, process in list(self._processes.items()):
                        if name.startswith("worker") and process.poll() is not None:
                            self._revive(name, process)
            except Exception:  # the supervisor must outlive any one failure
                log.exception("the stack's supervisor failed to restart a worker")
            try:
                if self.pacer is not None:
                    self.pacer.poll()
            except Exception:
                log.exception("the stack's supervisor failed to read the control loop's lag")

    def _revive(self, name: str, process: subprocess.Popen[bytes]) -> None:
        ran = time.monotonic() - self._started_at.get(name, 0.0)
        pause = 1.0 if ran > 60 else min(2 * self._pause.get(name, 0.5), 30.0)
        if ran < pause:
            return  # crashing over and over: wait a little longer each time
        self._pause[name] = pause
        log.warning(
            "%s exited with %s; starting it again (see %s)",
            name,
            process.returncode,
            self.data_dir / f"{name}.log",
            extra={"worker": name, "exit_code": process.returncode},
        )
        kill_group(process)  # its pool processes, if any are left
        self.restarts[name] = self.restarts.get(name, 0) + 1
        number = 1 if name == "worker" else int(name.rsplit("-", 1)[1])
        self._spawn_worker(number)

    def child_pids(self) -> dict[str, int]:
        """The process id of each child: ``api``, ``worker`` (and ``worker-2``...)."""
        with self._lock:
            return {name: process.pid for name, process in self._processes.items()}

    def worker_exit_code(self) -> int | None:
        """The worker's exit code once it has exited (None while it runs)."""
        process = self._processes.get("worker")
        return None if process is None else process.poll()

    def running_instances(self) -> list[str]:
        """Ids of broker-tagged instances not yet terminated, in both local clouds."""
        from providers.registry import build_providers

        found: list[str] = []
        providers = build_providers(get_settings())
        for region in self.cloud.aws_regions:
            for ref in providers["aws"].list_managed(region):
                if providers["aws"].describe(ref).status not in ("terminated", "preempted"):
                    found.append(ref.instance_id)
        regions = sorted({zone.rsplit("-", 1)[0] for zone in self.cloud.gcp_zones})
        for region in regions:
            for ref in providers["gcp"].list_managed(region):
                if providers["gcp"].describe(ref).status not in ("terminated", "preempted"):
                    found.append(ref.instance_id)
        return found
