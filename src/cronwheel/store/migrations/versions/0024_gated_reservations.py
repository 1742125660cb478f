"""gated reservations: runs.gated_at, runs.gates, ix_runs_gated

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 03:00:00

A workflow's node whose upstream nodes are all under way may be reserved by a worker
before it is ready (``docs/reservations.md``, gated reservations): ``gated_at`` says
since when it may be, and ``ix_runs_gated`` is what a lease finds such nodes by.
A workflow run's ``gates`` records the nodes whose gate opened while reserved (their
upstream nodes let them run): their holders begin them then, and record their starts
after (``store/sql/gates.py``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import GATED, OptionalJson, UtcDateTime

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gated_at", UtcDateTime, nullable=True))
        batch.add_column(sa.Column("gates", OptionalJson, nullable=True))
    op.create_index(
        "ix_runs_gated",
        "runs",
        ["pool", "tenant_id", "priority", "fire_at"],
        postgresql_where=sa.text(GATED),
        sqlite_where=sa.text(GATED),
    )


def downgrade() -> None:
    # A node reserved while gated goes back to waiting as before: unreserved, PENDING.
    op.execute(
        "UPDATE runs SET reserved_by = NULL, reserved_attempt = NULL, reserved_token = NULL, "
        "reserved_until = NULL WHERE state = 'PENDING' AND reserved_token IS NOT NULL"
    )
    op.drop_index("ix_runs_gated", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gates")
        batch.drop_column("gated_at")
