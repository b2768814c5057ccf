"""Services: each owns its transactions and calls the pure core, the database and the clouds.

API routes, CLI commands and Celery tasks call one service function each. Which module holds
which behaviour is the table "Where each behaviour lives" in ``docs/architecture.md``.
"""
