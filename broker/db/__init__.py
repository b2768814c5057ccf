"""Data: SQLModel tables, the engine and its unit of work, ids, and Alembic migrations."""
