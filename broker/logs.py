"""Logging for the API and the workers: text or one JSON object per line, secrets redacted.

``configure_logging(settings)`` gives the root logger one handler whose format follows
``BROKER_LOG_FORMAT`` (``text`` or ``json``); the ``extra`` fields the code passes (job_id,
attempt_id, team_id, zone, ...) become keys of the JSON object, or ``key=value`` pairs after a
text line. The handler redacts tokens (``adm_``, ``brk_``, ``tok_`` and ``att_`` values, bearer
and Authorization values, the configured secrets) from every record, whoever logged it: a
second line of defence behind never logging them in the first place.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from broker.settings import Settings

REDACTED = "[redacted]"

# Tokens are a prefix and >= 28 url-safe characters (admin, team keys, agent tokens); ids such
# as att_<24 hex> are shorter and stay readable.
_TOKEN = re.compile(r"\b(adm|brk|tok|att)_[A-Za-z0-9_\-]{28,}")
_VALUE = r"(?!\[redacted\])[^\s\"',;}\]]+"
_AUTHORIZATION = re.compile(
    # A quoted value (also bytes, b'...', as botocore logs its signing header) goes whole.
    r"(?i)(authorization[\"']?\s*[:=]\s*)(?:(b?)([\"'])(?!\[redacted\]).*?\3"
    r"|[\"']?(?:bearer\s+|basic\s+)?" + _VALUE + ")"
)


def _redact_authorization(match: re.Match[str]) -> str:
    quote = match.group(3)
    if quote:  # keep the quoting, so the line still reads as the dict or JSON it was
        return f"{match.group(1)}{match.group(2)}{quote}{REDACTED}{quote}"
    return f"{match.group(1)}{REDACTED}"


_BEARER = re.compile(r"(?i)\b(bearer)\s+" + _VALUE)
_SECRET_KEYS = frozenset({"token", "authorization", "password", "secret", "api_key"})

# Attributes every LogRecord has: whatever else a record carries came in through ``extra``.
_BLANK_RECORD = logging.LogRecord("", logging.INFO, "", 0, "", (), None)
# uvicorn's color_message repeats the message with ANSI colours.
_RECORD_FIELDS = frozenset(
    [*_BLANK_RECORD.__dict__, "message", "asctime", "taskName", "color_message"]
)

# Loggers that servers give handlers of their own; theirs go through ours instead, so that
# every line of a process has one format and passes the redaction.
_SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


class RedactSecrets(logging.Filter):
    """Rewrites a record's message, exception text and extra fields without token values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Short values would redact ordinary words; the patterns above cover the usual tokens.
        self.secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` with every token value replaced by ``[redacted]``."""
        text = _AUTHORIZATION.sub(_redact_authorization, text)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        text = _TOKEN.sub(lambda m: f"{m.group(1)}_{REDACTED}", text)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {
                k: REDACTED if str(k).lower() in _SECRET_KEYS else self._scrub(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self._scrub(v) for v in value)
        return value

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return True
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        for key in extra_fields(record):
            value = record.__dict__[key]
            record.__dict__[key] = REDACTED if key.lower() in _SECRET_KEYS else self._scrub(value)
        return True


def extra_fields(record: logging.LogRecord) -> list[str]:
    """Names of the fields a record got through ``extra``."""
    return [key for key in record.__dict__ if key not in _RECORD_FIELDS]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in extra_fields(record):
            entry.setdefault(key, record.__dict__[key])
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` (the extra fields, in the order given)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        extras = " ".join(f"{key}={record.__dict__[key]}" for key in extra_fields(record))
        return f"{line} {extras}" if extras else line


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure_logging(
    settings: Settings, *, level: int | str | None = None, stream: TextIO | None = None
) -> logging.Handler:
    """Give the root logger the broker's handler (format, redaction) at ``level``.

    ``level`` defaults to ``settings.log_level``, ``stream`` to the current stderr. Calling it
    again replaces the handler it added before; other handlers on the root logger stay.
    """
    handler: logging.Handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    secrets = [
        secret.get_secret_value()
        for secret in (
            settings.admin_token,
            settings.agent_secret,
            settings.api_token,
            settings.aws_secret_access_key,
        )
        if secret is not None
    ]
    handler.addFilter(RedactSecrets(secrets))
    handler.set_name("broker")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "broker"]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level or settings.log_level.upper())
    for name in _SERVER_LOGGERS:
        server_logger = logging.getLogger(name)
        server_logger.handlers.clear()
        server_logger.propagate = True
    return handler
