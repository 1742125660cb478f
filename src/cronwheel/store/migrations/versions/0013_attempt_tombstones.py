"""attempt_tombstones: attempts deleted with their job or tenant while in progress, so
that a worker's later report of one is refused as stale (409), not as unknown

Revision ID: 0013
Revises: 0010
Create Date: 2026-12-02 08:00:00

Job and tenant deletion remove runs, attempts and run events; the audit record of a
deletion is an event not tied to a run (``job.deleted``, ``tenant.deleted``), which
the events table already holds: nothing else changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_tombstones",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("deleted_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt_tombstones")),
    )
    op.create_index(
        "ix_attempt_tombstones_deleted_at", "attempt_tombstones", ["deleted_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_attempt_tombstones_deleted_at", table_name="attempt_tombstones")
    op.drop_table("attempt_tombstones")
