"""Job submission throughput: the broker's POST /v1/jobs vs a bare FastAPI + SQLModel insert.

Starts each app under uvicorn on a fresh PostgreSQL database, submits N jobs from concurrent
httpx clients, prints req/s, p50/p99 latency and the server process's CPU ms per request for
both (on a shared machine the ratio and CPU figures say more than the absolute rates), and a
JSON line last. The measured loop stays raw async httpx (the same requests for both apps, no
client-side overhead); the broker's team and key are set up through
``broker.client.BrokerClient``; its launch tasks go to a scratch data dir's file queue.

    python bench/api_submit.py [--jobs 2000] [--concurrency 16] [--pg postgresql+psycopg://...]

``--profile`` instead runs the broker in this process, one request at a time, with the thread
pool's calls made inline so that cProfile (which sees one thread) sees the whole request, and
prints the CPU ms per request and the functions that take the most CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
SPEC = {
    "name": "bench",
    "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 1000},
    "resources": {"gpus": 1},
    "deadline": "2027-06-01T00:00:00Z",
    "max_cost": "1.00",
    "run": {"command": "python train.py --steps 1000"},
}


def fresh_database(base: str) -> tuple[str, str]:
    name = f"broker_bench_{secrets.token_hex(4)}"
    with create_engine(base, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(base).set(database=name).render_as_string(hide_password=False), name


def drop_database(base: str, name: str) -> None:
    with create_engine(base, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(app: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            app,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url + "/docs", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{app} did not start")


async def hammer(url: str, headers: dict[str, str], jobs: int, concurrency: int) -> dict:
    latencies: list[float] = []
    failures = 0
    counter = iter(range(jobs))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures
        for i in counter:
            began = time.perf_counter()
            response = await client.post("/v1/jobs", json={**SPEC, "name": f"bench-{i}"})
            latencies.append(time.perf_counter() - began)
            failures += response.status_code != 201

    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {
        "req_per_s": jobs / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "failures": failures,
    }


def broker_headers(url: str, admin: str) -> dict[str, str]:
    """A new team's key as headers for the measured loop (set up through BrokerClient)."""
    from broker.client import BrokerClient

    with BrokerClient(url, admin) as api:
        team = api.create_team("bench", "1000000.00")
        token = api.create_key(team["id"], "b")["token"]
    return {"Authorization": f"Bearer {token}"}


def inline_thread_pool() -> None:
    """Make FastAPI's and Starlette's thread-pool calls run inline (profiling only)."""
    import anyio.to_thread
    import fastapi.concurrency
    import fastapi.dependencies.utils
    import fastapi.routing
    import starlette.concurrency

    async def run_sync(func, *args, **_):  # type: ignore[no-untyped-def]
        return func(*args)

    async def run_in_threadpool(func, *args, **kwargs):  # type: ignore[no-untyped-def]
        return func(*args, **kwargs)

    anyio.to_thread.run_sync = run_sync
    for module in (starlette.concurrency, fastapi.concurrency, fastapi.routing):
        module.run_in_threadpool = run_in_threadpool  # type: ignore[attr-defined]
    fastapi.dependencies.utils.run_in_threadpool = run_in_threadpool  # type: ignore[attr-defined]


async def profile_in_process(jobs: int, admin: str) -> None:
    """Submit ``jobs`` jobs one at a time to the app in this process under cProfile."""
    from broker.api import create_app

    app = create_app()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            as_admin = {"Authorization": f"Bearer {admin}"}
            budget = {"limit": "1000000.00", "period": "month", "alert_at": 0.8}
            team = await client.post(
                "/v1/teams", json={"name": "bench", "budget": budget}, headers=as_admin
            )
            key = await client.post(
                f"/v1/teams/{team.json()['id']}/keys", json={"name": "b"}, headers=as_admin
            )
            headers = {"Authorization": f"Bearer {key.json()['token']}"}
            for i in range(100):  # warm up: planning caches, pool connections
                await client.post("/v1/jobs", json={**SPEC, "name": f"warm-{i}"}, headers=headers)
            profiler = cProfile.Profile(time.process_time)
            began = time.process_time()
            profiler.enable()
            for i in range(jobs):
                response = await client.post(
                    "/v1/jobs", json={**SPEC, "name": f"bench-{i}"}, headers=headers
                )
                if response.status_code != 201:
                    raise RuntimeError(response.text)
            profiler.disable()
            used = time.process_time() - began
    print(
        f"in-process, under cProfile: {1000 * used / jobs:.2f} ms CPU per request (client included)"
    )
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(r"/broker/", 40)


def profile(jobs: int, pg: str) -> None:
    """``--profile``: the broker in this process on a fresh database, under cProfile."""
    url_db, name = fresh_database(pg)
    scratch = tempfile.TemporaryDirectory(prefix="broker-bench-")
    admin = "adm_" + secrets.token_hex(16)
    env = {
        "BROKER_DATABASE_URL": url_db,
        "BROKER_ADMIN_TOKEN": admin,
        "BROKER_DATA_DIR": scratch.name,
        "BROKER_LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    try:
        from broker.db.engine import create_schema

        create_schema()
        inline_thread_pool()
        asyncio.run(profile_in_process(jobs, admin))
    finally:
        from broker.db.engine import get_engine

        get_engine().dispose()
        drop_database(pg, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="profile the broker in-process")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--only", choices=("broker", "bare"), help="run one app only (no ratio): for A/B runs"
    )
    parser.add_argument(
        "--pg",
        default=os.environ.get(
            "BROKER_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    if args.profile:
        profile(args.jobs, args.pg)
        return

    results = {}
    scratch_dir = tempfile.TemporaryDirectory(prefix="broker-bench-")
    scratch = scratch_dir.name
    for label in (args.only,) if args.only else ("broker", "bare"):
        url_db, name = fresh_database(args.pg)
        try:
            if label == "broker":
                admin = "adm_" + secrets.token_hex(16)
                env = {
                    "BROKER_DATABASE_URL": url_db,
                    "BROKER_ADMIN_TOKEN": admin,
                    # launch tasks go to a throwaway file-system queue, not the repo's .broker
                    "BROKER_DATA_DIR": scratch,
                }
                subprocess.run(
                    [sys.executable, "-m", "broker.cli", "db", "upgrade"],
                    cwd=ROOT,
                    env={**os.environ, **env},
                    check=True,
                    capture_output=True,
                )
                process, url = start("broker.api:app", env)
                headers = broker_headers(url, admin)
            else:
                process, url = start("bench.bare_app:app", {"BARE_DATABASE_URL": url_db})
                headers = {}
            try:
                cpu = cpu_seconds(process.pid)
                results[label] = asyncio.run(hammer(url, headers, args.jobs, args.concurrency))
                results[label]["server_cpu_ms"] = (
                    1000 * (cpu_seconds(process.pid) - cpu) / args.jobs
                )
            finally:
                process.terminate()
                process.wait(timeout=10)
        finally:
            drop_database(args.pg, name)
        r = results[label]
        print(
            f"{label:>6}: {r['req_per_s']:8.1f} req/s  p50 {r['p50_ms']:6.1f} ms  "
            f"p99 {r['p99_ms']:6.1f} ms  server CPU {r['server_cpu_ms']:5.2f} ms/req  "
            f"failures {r['failures']}"
        )
    ratio = None
    if len(results) == 2:
        ratio = results["broker"]["req_per_s"] / results["bare"]["req_per_s"]
        print(f" ratio: broker / bare insert = {ratio:.2f} (goal >= 0.5; p99 goal <= 100 ms)")
    print(
        json.dumps(
            {
                "bench": "api_submit",
                "jobs": args.jobs,
                "concurrency": args.concurrency,
                **{f"{k}_{m}": v for k, r in results.items() for m, v in r.items()},
                "ratio": ratio,
            }
        )
    )


if __name__ == "__main__":
    main()
