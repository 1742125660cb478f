"""runs.progress_timeout and attempts.progress_*: a handler must report progress within
its job's progress timeout or its attempt ends TIMED_OUT; the attempt keeps when
progress was last reported and its details

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Json, UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_PROGRESS_LIVE = "state = 'RUNNING' AND progress_deadline IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("progress_timeout", sa.Float(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("progress_deadline", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("progress_at", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("progress_details", Json, nullable=True))
    op.create_index(
        "ix_attempts_progress",
        "attempts",
        ["progress_deadline"],
        postgresql_where=sa.text(_PROGRESS_LIVE),
        sqlite_where=sa.text(_PROGRESS_LIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_progress", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        for column in ("progress_details", "progress_at", "progress_deadline"):
            batch.drop_column(column)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("progress_timeout")
