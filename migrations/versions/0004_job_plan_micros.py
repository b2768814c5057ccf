"""job.plan: money as integer micro-dollars instead of decimal strings

The plan a job runs on was stored as the API showed it (``price_per_hour``,
``expected_cost`` and ``worst_case_cost`` as decimal strings); it is now stored as the
services keep it (``price_per_hour_micros``, ``expected_cost_micros`` and
``worst_case_cost_micros`` as integers). The column stays JSON; only the values change.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 10:00:00
"""
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = {
    'price_per_hour': 'price_per_hour_micros',
    'expected_cost': 'expected_cost_micros',
    'worst_case_cost': 'worst_case_cost_micros',
}
ROUNDED = ('expected_hours', 'p_deadline')  # the string form showed these to 4 decimals

job = sa.table('job', sa.column('id', sa.String()), sa.column('plan', sa.JSON()))


def _micros(amount: str) -> int:
    """Decimal dollars to micro-dollars, as broker.core.money.to_micros."""
    value = Decimal(amount) * 1_000_000
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def _usd(micros: int) -> str:
    """Micro-dollars as a decimal string, as broker.core.money.format_usd."""
    value = Decimal(micros) / 1_000_000
    if micros % 10_000 == 0:
        return str(value.quantize(Decimal('0.01')))
    return format(value.normalize(), 'f')


def _to_micros(plan: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in plan.items():
        if key in MONEY and isinstance(value, str):
            out[MONEY[key]] = _micros(value)
        else:
            out[key] = value
    return out


def _to_strings(plan: dict[str, Any]) -> dict[str, Any]:
    names = {micros: key for key, micros in MONEY.items()}
    out = {}
    for key, value in plan.items():
        if key in names and isinstance(value, int):
            out[names[key]] = _usd(value)
        elif key in ROUNDED and isinstance(value, float):
            out[key] = round(value, 4)
        else:
            out[key] = value
    return out


def _rewrite(convert: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    connection = op.get_bind()
    rows = connection.execute(sa.select(job.c.id, job.c.plan).where(job.c.plan.isnot(None)))
    changed = []
    for job_id, plan in rows.all():
        if isinstance(plan, dict):
            new = convert(plan)
            if new != plan:
                changed.append({'job_id': job_id, 'new_plan': new})
    if changed:
        connection.execute(
            job.update().where(job.c.id == sa.bindparam('job_id')).values(
                plan=sa.bindparam('new_plan', type_=sa.JSON())
            ),
            changed,
        )


def upgrade() -> None:
    _rewrite(_to_micros)


def downgrade() -> None:
    _rewrite(_to_strings)
