"""scheduler_nodes: the live scheduler nodes, so shards are shared among them

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 10:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_nodes",
        sa.Column("node_id", sa.String(length=100), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_scheduler_nodes")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_nodes")
