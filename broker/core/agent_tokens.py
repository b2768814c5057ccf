"""Per-attempt agent tokens: one attempt, until an expiry, signed with the broker's secret.

A token reads ``att_<expiry>.<mac>``: the expiry in whole Unix seconds of the broker's
clock, and the first 40 hex digits of HMAC-SHA256("<attempt id>.<expiry>") under the agent
secret. It is derived, not drawn, so a retried launch of the same attempt hands its
instance the same token; the broker stores only its hash, which binds the expiry too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime, timedelta

EXPIRY_MARGIN = timedelta(hours=1)
"""How long past its job's deadline a token still works: a final report may land late."""

_TOKEN = re.compile(r"att_([0-9]{1,11})\.[0-9a-f]{40}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def _ceil_seconds(when: datetime) -> int:
    """Unix seconds of ``when``, rounded up, exactly (no float)."""
    since = when - _EPOCH
    return since // _SECOND + (1 if since % _SECOND else 0)


def token_expiry(deadline: datetime) -> datetime:
    """When the tokens of a job with ``deadline`` expire: the deadline plus EXPIRY_MARGIN,
    up to the next whole second."""
    return _EPOCH + _ceil_seconds(deadline + EXPIRY_MARGIN) * _SECOND


def mint(secret: str, attempt_id: str, expires_at: datetime) -> str:
    """The token of ``attempt_id`` valid until ``expires_at`` (rounded up to a second)."""
    expiry = _ceil_seconds(expires_at)
    message = f"{attempt_id}.{expiry}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return f"att_{expiry}.{digest[:40]}"


def expires_at(token: str) -> datetime | None:
    """The expiry a token carries; None for a token without one (an attempt begun before
    tokens had expiries, or a random test token)."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return None
    return _EPOCH + int(match.group(1)) * _SECOND
