"""job: the latest start that meets its deadline on its plan (launch order)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 00:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("start_by", sa.DateTime(timezone=True), nullable=True))
    # Jobs admitted before: their deadline, the order they launched in until now.
    op.execute("UPDATE job SET start_by = deadline")


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("start_by")
