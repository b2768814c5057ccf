"""Alembic environment: the broker's models, its configured database, batch mode on SQLite."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlmodel import SQLModel

import broker.db.models  # noqa: F401  (registers the tables)
from broker.db.engine import make_engine
from broker.db.models import UTCDateTime
from broker.settings import get_settings

target_metadata = SQLModel.metadata


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render our column types as plain SQLAlchemy types, so migrations import nothing of ours."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and obj.__class__.__module__.startswith("sqlmodel"):
        autogen_context.imports.add("import sqlmodel")
    return False


def _configure(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(get_settings().resolved_database_url)
    with engine.connect() as connection:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(
        url=get_settings().resolved_database_url,
        target_metadata=target_metadata,
        render_item=render_item,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
