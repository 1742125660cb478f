"""workers.webhooks_only: a worker that calls webhooks and runs no task handlers (the
built-in webhook worker) does not count as able to take a pool's task runs

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 13:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(
            sa.Column("webhooks_only", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("webhooks_only")
