"""One control-loop tick over many live attempts on the local clouds: CPU, wall, cloud calls.

Launches ``--attempts`` on-demand attempts (light, in-process instances) spread over two EC2
regions (moto) and two GCE zones in two regions (the fake), each with its running attempt in
the database, then runs ``--ticks`` ticks as the beat's ``tick`` and the workers'
``observe_batch`` tasks do, in this process: the lease sweep, then ``Runner.observe_many``
over the live attempts in batches of ``--batch`` (``BROKER_OBSERVE_BATCH_SIZE``), the broker
clock one tick further each time. CPU seconds include the local clouds' threads (they run in
this process); the broker's own CPU is the tick's thread alone (``time.thread_time``: the
cloud clients' requests and parsing, the database driver, the decisions), what a worker
spends against a real cloud. Prints a table, then one JSON line.

    python -m bench.control_loop --attempts 100 1000 --database-url postgresql+psycopg://...
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.reconcile import AWS_REGIONS, GCP_ZONES, _populate
from broker import clock
from broker.clock import ManualClock
from broker.db.engine import create_schema, make_engine
from broker.heap import freeze_heap
from broker.services.quoting import get_planning
from broker.services.runner import Runner
from broker.settings import get_settings
from providers.aws import AwsProvider
from providers.base import Provider
from providers.gcp import GcpProvider
from providers.local import LocalCloud

TICK_SECONDS = 5.0


def _database(base: str | None, folder: Path, n: int) -> tuple[str, Any]:
    """A fresh database for one size: a PostgreSQL database created on ``base`` (dropped by
    the returned callable), else a SQLite file."""
    if not base:
        return f"sqlite:///{folder / f'broker-{n}.db'}", lambda: None
    name = f"bench_loop_{n}_{int(time.time())}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = base.rsplit("/", 1)[0] + "/" + name

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def _one_size(args: argparse.Namespace, count: int, folder: Path) -> dict[str, Any]:
    manual = ManualClock(datetime.now(UTC))
    clock.set_clock(manual)
    url, drop = _database(args.database_url, folder, count)
    engine = make_engine(url)
    try:
        create_schema(engine)
        with LocalCloud(
            aws_regions=AWS_REGIONS,
            gcp_zones=GCP_ZONES,
            market_interval_seconds=None,
            clock=manual,
            instance_runner="light",
        ) as cloud:
            settings = cloud.settings()
            providers: dict[str, Provider] = {
                "aws": AwsProvider.from_settings(settings, regions=AWS_REGIONS),
                "gcp": GcpProvider.from_settings(settings),
            }
            started = time.perf_counter()
            _populate(engine, providers, count)
            print(f"{count}: launched in {time.perf_counter() - started:.1f} s")
            runner = Runner(
                engine,
                providers,
                get_planning(),
                agent_secret="bench",
                api_url="http://127.0.0.1:9",
                tick_seconds=TICK_SECONDS,
                agent_silence_seconds=1e9,  # light instances run no agent
            )
            freeze_heap()  # as a worker's warm-up does (the local clouds' objects too)
            served = [0]
            decide = cloud.faults.decide

            def counted() -> Any:  # every request the local clouds serve asks it once
                served[0] += 1
                return decide()

            cloud.faults.decide = counted  # type: ignore[method-assign]
            walls, cpus, brokers, calls = [], [], [], []
            # the thread's CPU, as the figure it explains (not wall time waiting on the clouds)
            profiler = cProfile.Profile(time.thread_time) if args.profile else None
            try:
                for _ in range(args.ticks):
                    manual.advance(TICK_SECONDS * 60)  # a tick at x60
                    served[0] = 0
                    wall, cpu = time.perf_counter(), time.process_time()
                    mine = time.thread_time()
                    if profiler is not None:
                        profiler.enable()
                    runner.sweep_leases()
                    due = runner.due()
                    for start in range(0, len(due.observe), args.batch):
                        runner.observe_many(due.observe[start : start + args.batch])
                    if profiler is not None:
                        profiler.disable()
                    walls.append(time.perf_counter() - wall)
                    cpus.append(time.process_time() - cpu)
                    brokers.append(time.thread_time() - mine)
                    calls.append(served[0])
            finally:
                cloud.faults.decide = decide  # type: ignore[method-assign]
            if profiler is not None:
                pstats.Stats(profiler).sort_stats(args.profile_sort).print_stats(40)
    finally:
        engine.dispose()
        drop()
    cpu_s = statistics.median(cpus)
    broker_s = statistics.median(brokers)
    return {
        "attempts": count,
        "cloud_calls": statistics.median(calls),
        "wall_s": round(statistics.median(walls), 3),
        "cpu_s": round(cpu_s, 3),
        "cpu_ms_per_attempt": round(1000 * cpu_s / count, 3),
        "broker_cpu_s": round(broker_s, 3),
        "broker_cpu_ms_per_attempt": round(1000 * broker_s / count, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument(
        "--batch",
        type=int,
        default=get_settings().observe_batch_size,
        help="live attempts an observe task takes (default: BROKER_OBSERVE_BATCH_SIZE)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print where the tick's own thread spends its time"
    )
    parser.add_argument(
        "--profile-sort",
        default="cumulative",
        choices=["cumulative", "tottime"],
        help="the profile's order: cumulative time, or time in each function itself",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL server URL (a database is created and dropped per size); "
        "default: SQLite files",
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-loop-"))
    results = [_one_size(args, n, folder) for n in args.attempts]
    for row in results:
        print(
            f"{row['attempts']:>6} attempts: {row['cloud_calls']:>6} cloud calls  "
            f"{row['wall_s']:>8.3f} s wall  {row['cpu_s']:>8.3f} s CPU  "
            f"{row['cpu_ms_per_attempt']:>7.3f} ms CPU/attempt  "
            f"broker's thread {row['broker_cpu_s']:>7.3f} s CPU "
            f"({row['broker_cpu_ms_per_attempt']:.3f} ms/attempt)"
        )
    database = "postgresql" if args.database_url else "sqlite"
    print(json.dumps({"database": database, "batch": args.batch, "ticks": results}))


if __name__ == "__main__":
    main()
