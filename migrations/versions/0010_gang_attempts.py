"""attempt: gangs of nodes (multi-node jobs), the rendezvous address; attempt_node

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("master_addr", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("master_port", sa.Integer(), nullable=True))
    op.create_table(
        "attempt_node",
        sa.Column("attempt_id", sa.String(length=40), sa.ForeignKey("attempt.id"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("attempt_id", "rank"),
    )


def downgrade() -> None:
    op.drop_table("attempt_node")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("master_port")
        batch_op.drop_column("master_addr")
        batch_op.drop_column("nodes")
