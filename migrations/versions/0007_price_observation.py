"""price_observation: every price the clouds' pricing APIs gave, shared by all processes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 16:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'price_observation',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('provider', sa.String(length=20), nullable=False),
        sa.Column('region', sa.String(length=40), nullable=False),
        sa.Column('zone', sa.String(length=40), nullable=False),
        sa.Column('instance_type', sa.String(length=60), nullable=False),
        sa.Column('gpu', sa.String(length=40), server_default='', nullable=False),
        sa.Column('market', sa.String(length=10), nullable=False),
        sa.Column('micros_per_hour', sa.BigInteger(), nullable=False),
        sa.Column('observed_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('source', sa.String(length=40), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index(
        'ix_price_observation_key',
        'price_observation',
        ['provider', 'zone', 'instance_type', 'gpu', 'market', 'id'],
    )
    op.create_index(
        op.f('ix_price_observation_observed_at'), 'price_observation', ['observed_at']
    )


def downgrade() -> None:
    op.drop_index(op.f('ix_price_observation_observed_at'), table_name='price_observation')
    op.drop_index('ix_price_observation_key', table_name='price_observation')
    op.drop_table('price_observation')
