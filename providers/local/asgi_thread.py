"""An ASGI app served by uvicorn in a daemon thread on a loopback port (the GCP fakes)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class AsgiThread:
    """Serve ``app`` on ``host:port`` (0: a free port) until ``stop()``."""

    def __init__(self, app: Any, host: str, port: int, name: str) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        """``http://host:port``, valid once started."""
        if self._server is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Bind the port and serve in a thread; return once uvicorn is up."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None
