"""The broker's private local files: owner-only folders and secrets kept across restarts."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents as owner-only (0700) folders; returns ``path``.

    Folders that exist already keep their mode (the data folder may be one the user chose).
    """
    missing = []
    folder = Path(path).absolute()
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            continue
        folder.chmod(0o700)  # mkdir's mode went through the umask: make it exactly 0700
    return path


AGENT_SECRET_FILE = "agent_secret"
"""The agent secret's file in data_dir, when BROKER_AGENT_SECRET is not set."""


def kept_secret(path: Path) -> str:
    """The random secret kept at ``path``: generated on first use (0600, in a 0700 folder),
    then read back, so restarts keep it. Concurrent first uses agree on one secret."""
    path = Path(path)
    if not path.exists():
        private_dir(path.parent)
        fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(32))
            with contextlib.suppress(FileExistsError):  # another process's secret stands
                os.link(draft, path)  # appears whole, never half-written
        finally:
            os.unlink(draft)
    secret = path.read_text().strip()
    if not secret:
        raise RuntimeError(f"{path} is empty: remove it to have a new secret generated")
    return secret
