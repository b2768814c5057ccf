"""job: when its work was observed complete (deadline met or missed), on-demand-only cost

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 19:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("on_demand_only_micros", sa.BigInteger(), nullable=True))
    # A job that succeeded before this column existed: its finish is the best time known.
    op.execute("UPDATE job SET completed_at = finished_at WHERE status = 'succeeded'")


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("on_demand_only_micros")
        batch_op.drop_column("completed_at")
