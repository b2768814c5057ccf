"""The embedded default's files: ``prepare`` makes a data folder only its owner can enter,
with the admin token, the SQLite database and the Celery folders inside owner-only too."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.db import engine as db
from broker.devstack.embedded import prepare
from broker.settings import get_settings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Settings for a data folder that does not exist yet; no database URL, no admin token."""
    folder = tmp_path / "home" / ".broker"
    monkeypatch.setenv("BROKER_DATA_DIR", str(folder))
    monkeypatch.delenv("BROKER_DATABASE_URL", raising=False)
    monkeypatch.delenv("BROKER_ADMIN_TOKEN", raising=False)  # prepare() sets it; undone after
    monkeypatch.delenv("BROKER_CELERY_BROKER_URL", raising=False)
    old_umask = os.umask(0o022)
    get_settings.cache_clear()
    db.get_engine.cache_clear()
    yield folder
    os.umask(old_umask)
    db.get_engine().dispose()
    get_settings.cache_clear()
    db.get_engine.cache_clear()


def test_prepare_makes_the_data_folder_0700_and_its_files_0600(fresh: Path) -> None:
    token, generated = prepare()

    assert generated and token.startswith("adm_")
    assert mode(fresh) == 0o700
    assert mode(fresh / "admin_token") == 0o600
    assert mode(fresh / "broker.db") == 0o600
    get_settings().celery_transport_options()  # the file-system transport's folders
    for folder in ("celery", "celery/queue", "celery/control"):
        assert mode(fresh / folder) == 0o700, folder
