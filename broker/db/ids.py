"""Identifiers: a prefix, then time-ordered hex, so ids sort by creation (cursor pagination)."""

from __future__ import annotations

import secrets
import threading
import time

_lock = threading.Lock()
_last = 0


def new_id(prefix: str) -> str:
    """A new id like ``job_0190a1b2c3d4e5f6a7b8c9d0``: increasing µs in hex, then 8 random hex."""
    global _last
    with _lock:
        stamp = max(time.time_ns() // 1000, _last + 1)
        _last = stamp
    return f"{prefix}_{stamp:016x}{secrets.token_hex(4)}"
