"""Serving the API under uvicorn with slow clients cut off.

uvicorn bounds the idle time between requests (``--timeout-keep-alive``) and h11 the size of a
request head (``--h11-max-incomplete-event-size``), but nothing bounds the time a client takes
to send the head: one header line a minute holds a connection for ever, before any auth.
``TimedH11Protocol`` answers ``408`` and closes the connection when a request's head has not
arrived within ``BROKER_HEADER_TIMEOUT_SECONDS`` of the connection opening or of the previous
response. The body's time is bounded in the app (``broker.api.limits.BodyLimits``).

``UVICORN_ARGS`` are the options to run uvicorn with (the embedded stack uses them; so should a
production command line).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from broker.settings import get_settings

UVICORN_ARGS = (
    "--http",
    "broker.api.server:TimedH11Protocol",
    "--timeout-keep-alive",
    "5",
    "--h11-max-incomplete-event-size",
    "16384",
)

_MESSAGE = b"request head not received in time"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_MESSAGE), _MESSAGE)
)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = get_settings().header_timeout_seconds
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # a whole head arrived (or the end)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Keep-alive's own timer stops at the first byte of the next request; this one does not.
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.logger.info("request head not received in %ss: 408", self.header_timeout)
        self.transport.write(_TIMED_OUT)
        self.transport.close()
