"""Engine, sessions and the unit of work: SQLite (WAL, foreign keys, immediate write
transactions) or PostgreSQL.

The unit of work is one service function's transaction. The caller opens a session
(``open_session``; the API's ``get_session``) and may make several service calls with it;
each service function that changes the database starts its transaction with ``begin_write``
(itself, or through ``lock_job`` / ``lock_team``, which also lock the row), makes the reads
the change depends on and the change, and ends with ``session.commit()``, or with
``session.rollback()`` (or a domain error, before any change) when it changes nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from psycopg.types.array import ListBinaryDumper
from sqlalchemy import String, any_, bindparam, event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine, make_url
from sqlmodel import Session, create_engine

from broker.private_files import private_dir
from broker.settings import get_settings


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, foreign keys, BEGIN IMMEDIATE transactions and an
    owner-only file (0600, in a 0700 folder when it makes one)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
        event.listen(engine, "connect", _binary_arrays)
        return engine

    if parsed.database and parsed.database != ":memory:":
        _private_file(Path(parsed.database))
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (see "begin" below).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:  # type: ignore[no-untyped-def]
        # Writers take the write lock up front (see begin_write), so read-then-write
        # transactions queue on busy_timeout instead of failing on lock upgrade; readers
        # stay deferred and never hold the lock across a thread hop.
        if connection.get_execution_options().get(_WRITE):
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.exec_driver_sql("BEGIN")

    return engine


def _binary_arrays(dbapi_connection: Any, _record: Any) -> None:
    """Send list parameters (a batch's ids, ``unnest`` columns) in PostgreSQL's binary array
    format: psycopg's text format quotes each element through two regular expressions, which
    was a fifth of the control loop's CPU at 1,000 attempts (``bench/control_loop.py``)."""
    dbapi_connection.adapters.register_dumper(list, ListBinaryDumper)


def _private_file(path: Path) -> None:
    """Create the SQLite file 0600 before SQLite does (it would use the umask, often 0644);
    SQLite gives its -wal and -shm files the database file's mode."""
    private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


@lru_cache
def get_engine() -> Engine:
    """The process-wide engine for the configured database."""
    return make_engine(get_settings().resolved_database_url)


_WRITE = "broker_write"


def open_session(engine: Engine | None = None) -> Session:
    """A session for one or more service calls; what a service returns stays readable after
    its commit (``expire_on_commit=False``)."""
    return Session(engine or get_engine(), expire_on_commit=False)


def begin_write(session: Session) -> None:
    """Start a unit of work: the session's next transaction is a write transaction.

    On SQLite this is BEGIN IMMEDIATE (a read transaction that is open is committed first, so
    call this before the reads that the write depends on); on PostgreSQL a plain BEGIN, with
    rows locked where needed by FOR UPDATE.
    """
    if session.get_bind().dialect.name != "sqlite":
        return
    if session.in_transaction():
        if session.connection().get_execution_options().get(_WRITE):
            return
        session.commit()
    session.connection(execution_options={_WRITE: True})


def is_postgres(session: Session) -> bool:
    """Whether the session talks to PostgreSQL (row locks with FOR UPDATE)."""
    bind = session.get_bind()
    return bind.dialect.name == "postgresql"


def one_of(session: Session, column: Any, values: Iterable[str]) -> Any:
    """``column IN values`` for a batch's string keys. On PostgreSQL the values go as one
    array parameter (``= ANY(...)``): the statement's text is the same for every batch, so
    neither SQLAlchemy (an expanding IN is rendered at each execution) nor the driver (which
    parses each new text) does per-value work; measured at 2-3 ms of CPU a statement for 100
    values in ``bench/control_loop.py``."""
    if is_postgres(session):
        return column == any_(bindparam(None, list(values), type_=ARRAY(String)))
    return column.in_(list(values))


def create_schema(engine: Engine | None = None) -> None:
    """Bring the database to the newest schema through Alembic."""
    from broker.db.migrate import upgrade

    upgrade(engine or get_engine())
