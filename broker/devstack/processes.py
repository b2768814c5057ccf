"""Child processes of the local stack: started so none outlives its parent, killed with
their process group, and waited for until the API answers."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import httpx


def die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies, so no worker outlives its stack."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child and everything in its process group (a worker's pool processes)."""
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def wait_until_healthy(
    url: str,
    processes: Mapping[str, subprocess.Popen],
    where: Callable[[str], str],
    timeout: float = 60.0,
) -> None:
    """Poll ``url``/healthz until it answers 200; raise if one of ``processes`` exits first.

    ``where(name)`` tells the error where to look (a log path, or the log itself).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, process in processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; {where(name)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    logs = "; ".join(where(name) for name in processes)
    raise RuntimeError(f"{url} did not answer /healthz; {logs}")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def api_argv(port: int, log_level: str = "warning", host: str = "127.0.0.1") -> list[str]:
    """The command that serves the API under uvicorn, slow clients cut off (``api.server``)."""
    from broker.api.server import UVICORN_ARGS  # imports the app: only when it is needed

    return [
        sys.executable,
        "-m",
        "uvicorn",
        "broker.api:app",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        log_level,
        *UVICORN_ARGS,
    ]
