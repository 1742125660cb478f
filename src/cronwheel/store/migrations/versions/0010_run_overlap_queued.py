"""runs.overlap_queued: a run of an overlap=queue_one job that fired while an earlier
run was still going, and waits for it; before, only its reason's text said so

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 22:30:00

The runs waiting so today are marked from that text, once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("overlap_queued", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        "UPDATE runs SET overlap_queued = TRUE"
        " WHERE state = 'SCHEDULED' AND reason LIKE 'queued behind%'"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("overlap_queued")
