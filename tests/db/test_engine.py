"""``make_engine`` on SQLite: the database file and its WAL files are the owner's only (0600),
and a folder it has to create is 0700; ``one_of`` on either database."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import select

from broker.db.engine import make_engine, one_of, open_session
from broker.db.models import Team


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_database_is_0600_in_a_0700_folder(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # the usual one, which would leave 0644 files
    try:
        path = tmp_path / "made" / "here" / "broker.db"
        engine = make_engine(f"sqlite:///{path}")
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER)"))
            connection.execute(text("INSERT INTO t VALUES (1)"))
        with engine.connect() as connection:  # keeps -wal and -shm while open
            assert connection.execute(text("SELECT x FROM t")).scalar() == 1
            wal = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
            assert all(p.exists() for p in wal)
            assert [mode(p) for p in (path, *wal)] == [0o600, 0o600, 0o600]
        engine.dispose()
    finally:
        os.umask(old_umask)
    assert mode(tmp_path / "made") == 0o700
    assert mode(tmp_path / "made" / "here") == 0o700


def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    engine = make_engine(f"sqlite:///{tmp_path / 'broker.db'}")
    with engine.begin() as connection:
        connection.execute(text("SELECT 1"))
    engine.dispose()
    assert mode(tmp_path) == 0o755
    assert mode(tmp_path / "broker.db") == 0o600


AWKWARD = ["plain", "a,b", 'say "hi"', "back\\slash", "NULL", " padded ", "{braces}", "é–ü"]


def test_one_of_matches_exactly_the_keys_it_is_given(db_engine: Engine) -> None:
    """A batch's keys go as one parameter (on PostgreSQL a binary array): keys holding the
    array syntax's delimiters, quotes, backslashes, spaces or the word NULL match themselves
    only, and an empty batch matches nothing."""
    now = datetime(2026, 12, 3, tzinfo=UTC)
    with open_session(db_engine) as session:
        for key in AWKWARD:
            session.add(
                Team(
                    id=key,
                    name=f"team {key}",
                    budget_limit_micros=1,
                    budget_period="total",
                    created_at=now,
                    updated_at=now,
                )
            )
        session.commit()
        for wanted in (AWKWARD, AWKWARD[1::2], ["NULL"], ["a", "b"], []):
            found = session.exec(select(Team.id).where(one_of(session, Team.id, wanted))).all()
            assert sorted(found) == sorted(key for key in wanted if key in AWKWARD)
