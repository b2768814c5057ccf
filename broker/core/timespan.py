"""Time spans as people write a relative deadline: ``+8h``, ``+90m``, ``+1d12h``.

One grammar for every client and the API: ``+``, then one or more parts of a number
(decimals allowed) and a unit, ``s``, ``m``, ``h``, ``d`` or ``w``; spaces between parts are
allowed. Pure: it parses text and never reads the clock; the caller adds the span to its
own "now".
"""

from __future__ import annotations

import re
from datetime import timedelta

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SPAN_PATTERN = r"^\s*\+\s*([0-9]+(\.[0-9]+)?\s*[smhdw]\s*)+$"
"""The grammar as a regular expression for a JSON schema (surrounding spaces allowed)."""
EXAMPLES = "+8h, +90m, +2d or +1d12h"

_SPAN = re.compile(r"\+\s*((?:[0-9]+(?:\.[0-9]+)?\s*[smhdw]\s*)+)")
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw])")


def is_span(text: str) -> bool:
    """Whether ``text`` is meant as a span (it starts with ``+``), valid or not."""
    return text.strip().startswith("+")


def parse_span(text: str) -> timedelta:
    """The span ``text`` stands for, such as ``+1d12h``; ValueError naming it otherwise."""
    match = _SPAN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a time span: write one like {EXAMPLES}")
    seconds = sum(float(n) * UNIT_SECONDS[u] for n, u in _PART.findall(match.group(1)))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text!r} is too long a time span") from None
