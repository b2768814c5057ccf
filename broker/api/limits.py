"""An ASGI middleware that bounds request bodies: over a size limit is 413, slower than a time
limit is 408, both before the app (or its auth) sees the request."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import anyio

Scope = dict[str, Any]
Message = dict[str, Any]


class _TooLarge(Exception):
    pass


class BodyLimits:
    """Read a request's whole body first, within ``max_bytes`` and ``timeout_seconds`` (counted
    from the end of the head); then hand the app the body as if it came from the client.
    ``path_limits``: other size limits for paths matching a regular expression."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        timeout_seconds: float,
        path_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds
        self.path_limits = [(re.compile(p), n) for p, n in (path_limits or {}).items()]

    def _limit(self, path: str) -> int:
        for pattern, limit in self.path_limits:
            if pattern.match(path):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        limit = self._limit(scope.get("path", ""))
        if length is not None and (not length.isdigit() or int(length) > limit):
            await self._refuse(send, 413, "too_large", f"request body over {limit} bytes")
            return
        if length in (None, b"0") and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body to wait for
            return
        try:
            with anyio.fail_after(self.timeout_seconds):
                body = await self._read(receive, limit)
        except _TooLarge:
            await self._refuse(send, 413, "too_large", f"request body over {limit} bytes")
            return
        except TimeoutError:
            message = f"request body not received within {self.timeout_seconds:g} s"
            await self._refuse(send, 408, "timeout", message)
            return
        if body is None:
            return  # the client went away: nobody to answer
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Any, limit: int) -> bytes | None:
        """The whole body; None when the client disconnects first."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise _TooLarge
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _refuse(self, send: Any, status: int, code: str, message: str) -> None:
        payload = json.dumps({"detail": {"code": code, "message": message}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        if status == 408:  # the rest of the body may still trickle in: stop reading it
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
