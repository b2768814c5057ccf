"""The embedded default: a local data folder, its SQLite database and a generated admin token."""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from pathlib import Path

from broker.db.engine import create_schema, get_engine
from broker.private_files import private_dir
from broker.settings import Settings, get_settings


def ensure_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin token: from settings, or generated once and kept in the data folder.

    Returns the token and whether it was generated just now (print it then, and only then).
    """
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value(), False
    path = Path(settings.data_dir) / "admin_token"
    if path.exists():
        return path.read_text().strip(), False
    private_dir(path.parent)
    token = "adm_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token)
    return token, True


def scaled_epoch(settings: Settings, scale: float) -> datetime | None:
    """The epoch of a scaled clock, kept in the data folder so restarts keep time moving on."""
    if scale == 1.0:
        return None
    if settings.clock_epoch is not None:
        return settings.clock_epoch
    path = Path(settings.data_dir) / "clock_epoch"
    if path.exists():
        return datetime.fromisoformat(path.read_text().strip())
    private_dir(path.parent)
    epoch = datetime.now(UTC)
    path.write_text(epoch.isoformat())
    return epoch


def prepare() -> tuple[str, bool]:
    """Create the data folder (0700) and schema; make the admin token visible to this process."""
    settings = get_settings()
    private_dir(Path(settings.data_dir))
    token, generated = ensure_admin_token(settings)
    os.environ["BROKER_ADMIN_TOKEN"] = token
    get_settings.cache_clear()
    create_schema(get_engine())
    return token, generated
