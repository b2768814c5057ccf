"""The agent secret: the setting when given, else one generated once in the data folder."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker.private_files import AGENT_SECRET_FILE, kept_secret
from broker.services.wiring import agent_secret
from broker.settings import Settings


@pytest.fixture(autouse=True)
def _no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BROKER_AGENT_SECRET", raising=False)


def test_the_agent_secret_survives_a_restart_in_an_owner_only_file(tmp_path) -> None:
    first = agent_secret(Settings(data_dir=tmp_path / "data"))
    restarted = agent_secret(Settings(data_dir=tmp_path / "data"))  # a new process, same folder
    assert restarted == first and len(first) >= 32
    path = tmp_path / "data" / AGENT_SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert agent_secret(Settings(data_dir=tmp_path / "elsewhere")) != first


def test_the_setting_wins_over_the_kept_secret(tmp_path) -> None:
    assert agent_secret(Settings(data_dir=tmp_path, agent_secret="from-env")) == "from-env"
    assert not (tmp_path / AGENT_SECRET_FILE).exists()


def test_processes_starting_together_agree_on_one_secret(tmp_path) -> None:
    with ThreadPoolExecutor(8) as pool:
        secrets = set(pool.map(lambda _: kept_secret(tmp_path / "s"), range(16)))
    assert len(secrets) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no drafts left behind
