"""``pack_workdir``: what ``BrokerClient.upload_workdir`` sends (the upload itself is in
tests/cli/test_jobs.py and tests/api/test_workdirs.py)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from broker.client import WorkdirTooLarge, pack_workdir


def names(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_a_folder_packs_without_vcs_caches_and_venvs(tmp_path: Path) -> None:
    for folder in (".git/objects", ".venv/bin", "pkg/__pycache__", "data"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / ".git" / "objects" / "ab").write_bytes(b"x")
    (tmp_path / ".venv" / "bin" / "python").write_bytes(b"x")
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "pkg" / "stale.pyc").write_bytes(b"x")
    (tmp_path / "pkg" / "m.py").write_text("X = 1\n")
    (tmp_path / "data" / "labels.txt").write_text("cat\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "latest").symlink_to("train.py")
    archive = pack_workdir(tmp_path)
    assert names(archive) == [
        "data",
        "data/labels.txt",
        "latest",
        "pkg",
        "pkg/m.py",
        "train.py",
    ]
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert tar.getmember("latest").issym()
        assert tar.extractfile("train.py").read() == b"print('hi')\n"  # type: ignore[union-attr]
        assert {m.uname for m in tar.getmembers()} == {""}


def test_the_same_files_pack_to_the_same_bytes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    first = pack_workdir(tmp_path)
    os.utime(tmp_path, (0, 0))  # the folder's own time is not in the archive
    assert pack_workdir(tmp_path) == first


def test_a_folder_over_the_limit_is_refused_with_advice(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(os.urandom(2_000_000))
    with pytest.raises(WorkdirTooLarge, match=r"more than 0\.954 MiB.*leave data sets"):
        pack_workdir(tmp_path, limit_bytes=1_000_000)


def test_a_file_is_no_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x")
    with pytest.raises(NotADirectoryError):
        pack_workdir(tmp_path / "train.py")
