"""Slow clients are cut off: the API as the embedded stack serves it (``api_argv``: uvicorn with
``TimedH11Protocol`` and ``BodyLimits``) on loopback, driven by a raw socket that trickles a
request's head or body. The server answers 408 and closes within the bound, before any auth."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.devstack.processes import api_argv, free_port

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
BOUND = 1.0  # header and body timeouts of the server under test, seconds


@pytest.fixture(scope="module")
def server(engine) -> Iterator[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """The API under uvicorn in a subprocess, with BOUND-second head and body timeouts."""
    port = free_port()
    env = {
        **os.environ,
        "BROKER_HEADER_TIMEOUT_SECONDS": str(BOUND),
        "BROKER_BODY_TIMEOUT_SECONDS": str(BOUND),
    }
    process = subprocess.Popen(api_argv(port), env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "uvicorn exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        process.wait(timeout=15)


def trickle(
    address: tuple[str, int], first: bytes, drip: bytes, limit: float = 10.0
) -> tuple[bytes, float]:
    """Send ``first``, then ``drip`` every 0.2 s until the server closes the connection.

    Returns what the server sent, and the seconds from its last answer but a 408 (or from
    the start) to the close."""
    received = b""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(first)
        since = time.monotonic()
        while time.monotonic() - since < limit:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if not readable:
                try:
                    sock.send(drip)
                except OSError:
                    break
                continue
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
            # A response before the 408 (possibly in several chunks): the next head's deadline
            # starts when it ends. The 408 itself may arrive as head and body in two chunks.
            if b"HTTP/1.1 408 " not in received:
                since = time.monotonic()
        return received, time.monotonic() - since


def test_a_head_sent_slowly_gets_408_and_the_connection_closes(server) -> None:  # type: ignore[no-untyped-def]
    received, took = trickle(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")

    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert BOUND - 0.1 <= took <= BOUND + 2.0, took


def test_a_body_sent_slowly_gets_408_before_auth_and_the_connection_closes(server) -> None:  # type: ignore[no-untyped-def]
    head = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 200\r\n\r\n{"
    )
    received, took = trickle(server, head, b" ")

    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b'"code":"timeout"' in received.replace(b" ", b"")
    assert BOUND - 0.1 <= took <= BOUND + 2.0, took


def test_the_next_head_on_a_kept_alive_connection_is_timed_too(server) -> None:  # type: ignore[no-untyped-def]
    # Keep-alive's own timer stops at the first byte; the head's deadline does not.
    first = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
    received, took = trickle(server, first, b"G")

    assert received.startswith(b"HTTP/1.1 200 "), received[:200]
    assert b"HTTP/1.1 408 " in received
    assert BOUND - 0.1 <= took <= BOUND + 2.0, took


def test_a_prompt_request_is_served_as_usual(server) -> None:  # type: ignore[no-untyped-def]
    host, port = server
    response = httpx.post(f"http://{host}:{port}/v1/jobs", json={"name": "x"}, timeout=5)
    assert response.status_code == 401  # the body went through the guard to the app's auth
