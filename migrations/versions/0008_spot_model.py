"""spot_model: one spot model per (provider, zone, instance family), shared by all processes

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "spot_model",
        sa.Column("provider", sa.String(length=20), nullable=False),
        sa.Column("zone", sa.String(length=40), nullable=False),
        sa.Column("family", sa.String(length=40), nullable=False),
        sa.Column("up_runs", sa.JSON(), nullable=False),
        sa.Column("down_runs", sa.JSON(), nullable=False),
        sa.Column("last_available", sa.Boolean(), nullable=False),
        sa.Column("age_hours", sa.Float(), nullable=False),
        sa.Column("prior", sa.String(length=500), nullable=False),
        sa.Column("prior_runs", sa.Integer(), nullable=False),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.Column("preemptions_per_hour", sa.Float(), nullable=False),
        sa.Column("mean_window_hours", sa.Float(), nullable=False),
        sa.Column("mean_outage_hours", sa.Float(), nullable=False),
        sa.Column("fitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("provider", "zone", "family"),
    )
    op.create_index(op.f("ix_spot_model_fitted_at"), "spot_model", ["fitted_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_spot_model_fitted_at"), table_name="spot_model")
    op.drop_table("spot_model")
