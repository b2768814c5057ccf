"""Opaque page tokens for the local clouds' list calls: an offset bound to one query."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any


def query_key(*parts: Any) -> str:
    """A short digest of what a list call asked (its filters), to bind tokens to it."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def page_token(offset: int, query: str) -> str:
    """The token of the page that starts at ``offset`` of ``query``'s results."""
    return base64.urlsafe_b64encode(json.dumps([offset, query]).encode()).decode()


def page_offset(token: str | None, query: str) -> int | None:
    """Where ``token`` points (0 without one); None for a token ``query`` did not hand out."""
    if not token:
        return 0
    try:
        offset, bound = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(offset) if bound == query else None
    except (ValueError, TypeError):
        return None
