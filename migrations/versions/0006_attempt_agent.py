"""attempt: what its agent said (last_heard_at, exit_code, log_bytes, log_chunks)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 13:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_heard_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('exit_code', sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column('log_bytes', sa.BigInteger(), server_default='0', nullable=False)
        )
        batch_op.add_column(
            sa.Column('log_chunks', sa.Integer(), server_default='0', nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.drop_column('log_chunks')
        batch_op.drop_column('log_bytes')
        batch_op.drop_column('exit_code')
        batch_op.drop_column('last_heard_at')
