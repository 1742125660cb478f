"""runs.origin: where a run came from (once, schedule, trigger, backfill, replay)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("origin", sa.String(length=10), server_default="once", nullable=False)
        )
        batch.create_check_constraint(
            "origin", "origin IN ('once', 'schedule', 'trigger', 'backfill', 'replay')"
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("origin", type_="check")
        batch.drop_column("origin")
