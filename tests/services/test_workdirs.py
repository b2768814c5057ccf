"""Checking an uploaded workdir archive: sizes counted from the headers, so a gzip bomb
stops at the limit."""

from __future__ import annotations

import io
import tarfile

import pytest

from broker.core.errors import InvalidInput
from broker.services.workdirs import MAX_MEMBERS, check_archive


def archive(sizes: dict[str, int]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, size in sizes.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"\0" * size))
    return buffer.getvalue()


def test_the_unpacked_size_is_the_sum_of_the_files():
    assert check_archive(archive({"a": 1000, "b/c": 24}), unpacked_limit=1024) == 1024


def test_an_archive_unpacking_past_the_limit_is_refused():
    bomb = archive({"zeros": 20_000_000})  # about 20 KB compressed
    assert len(bomb) < 100_000
    with pytest.raises(InvalidInput, match="unpacks to more than 1000000 bytes"):
        check_archive(bomb, unpacked_limit=1_000_000)


def test_an_archive_of_too_many_members_is_refused():
    with pytest.raises(InvalidInput, match=f"more than {MAX_MEMBERS}"):
        check_archive(archive({f"f{i}": 0 for i in range(MAX_MEMBERS + 1)}), 10**9)
