"""Many concurrent requests never starve the API of database connections.

The API runs its database work in ``api_threads`` threads and holds at most the engine
pool's connections (15 on SQLite). A request must not keep a connection while it waits for
a thread: with more such requests than the pool holds, the requests running in the threads
wait for a connection that only a thread can give back, until the pool's 30 s timeout (the
demo's "the broker API did not answer in time", stop 35's CI failure).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from anyio import to_thread

pytestmark = pytest.mark.timeout(120)

REQUESTS = 48  # more than the pool's 15 connections and the 8 threads together


def _get_all(base: str, requests: list[tuple[str, dict[str, str]]]) -> list[tuple[int, float]]:
    def get(request: tuple[str, dict[str, str]]) -> tuple[int, float]:
        path, headers = request
        started = time.monotonic()
        with httpx.Client(base_url=base, headers=headers, timeout=25) as http:
            try:
                code = http.get(path).status_code
            except httpx.TimeoutException:
                code = 0
        return code, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(get, requests))


def test_concurrent_reads_never_wait_for_a_connection_held_by_a_finished_request(
    live_server, make_team, admin_headers
):
    _, headers = make_team(limit="100.00")
    requests = [
        ("/v1/jobs", headers) if i % 2 else ("/v1/teams", admin_headers) for i in range(REQUESTS)
    ]
    for _ in range(3):  # each round starts with every thread and connection free
        answers = _get_all(live_server, requests)
        assert [code for code, _ in answers] == [200] * REQUESTS, answers
        assert max(seconds for _, seconds in answers) < 10, answers


def test_reads_after_a_new_key_is_checked_in_the_database_never_starve_either(
    live_server, make_team
):
    """A key the API has not trusted yet is looked up in the database before the route runs:
    that lookup must not keep its connection while the route waits for a thread."""
    keys = [make_team(limit="100.00")[1] for _ in range(REQUESTS // 4)]
    requests = [("/v1/jobs", keys[i % len(keys)]) for i in range(REQUESTS)]
    answers = _get_all(live_server, requests)
    assert [code for code, _ in answers] == [200] * REQUESTS, answers
    assert max(seconds for _, seconds in answers) < 10, answers


def test_a_burst_of_reads_arriving_at_once_never_waits_for_the_connections_it_holds(
    app, db_engine, make_team, monkeypatch
):
    """All at once, as on a loaded machine where requests pile up before the threads run: a
    read's response is validated in another trip to the thread pool, after its endpoint
    returned. Holding the read's connection across that trip starved the pool (stop 36's
    busy demo)."""
    monkeypatch.setattr(db_engine.pool, "_timeout", 3)  # a starved pool fails in 3 s, not 30
    _, headers = make_team(limit="100.00")
    burst = 80  # more than the 8 threads and PostgreSQL's 30 connections together

    async def all_at_once() -> list[httpx.Response | BaseException]:
        to_thread.current_default_thread_limiter().total_tokens = 8  # the default api_threads
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            gets = [http.get("/v1/jobs", headers=headers) for _ in range(burst)]
            return await asyncio.gather(*gets, return_exceptions=True)

    answers = asyncio.run(all_at_once())
    codes = [getattr(answer, "status_code", repr(answer)[:90]) for answer in answers]
    assert codes == [200] * burst
