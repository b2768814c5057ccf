"""attempt: spend lease (lease_until)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 10:30:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_attempt_lease_until'), ['lease_until'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempt_lease_until'))
        batch_op.drop_column('lease_until')
