"""runs.wait_reason: why a dispatched run waits (no live worker can take it);
workers.deregistered_at: a worker that said goodbye no longer counts as live

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_WAITING = "wait_reason IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("wait_reason", sa.Text(), nullable=True))
    op.create_index(
        "ix_runs_waiting",
        "runs",
        ["tenant_id", "pool"],
        postgresql_where=sa.text(_WAITING),
        sqlite_where=sa.text(_WAITING),
    )
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("deregistered_at", UtcDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("deregistered_at")
    op.drop_index("ix_runs_waiting", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("wait_reason")
