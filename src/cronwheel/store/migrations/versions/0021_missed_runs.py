"""runs.missed_at, jobs.schedule_stalled_at: missed-run and stalled-schedule detection

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 22:30:00

``runs.missed_at``: when the scheduler found the run still undispatched past its fire
time plus its job's lateness budget (docs/alerts.md). ``jobs.schedule_stalled_at``:
when it found an active recurring job with no run to fire its next occurrence, that
occurrence past its budget. Two indexes on jobs: the stalled ones (what the alerts
read) and the active recurring ones (what the stalled-schedule sweep walks). No index
on runs: missed runs are found through the due index (``ix_runs_due``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_STALLED = "schedule_stalled_at IS NOT NULL"
_RECURRING = "state = 'active' AND kind IN ('cron', 'interval')"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("missed_at", UtcDateTime(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("schedule_stalled_at", UtcDateTime(), nullable=True))
    op.create_index(
        "ix_jobs_stalled",
        "jobs",
        ["tenant_id", "schedule_stalled_at"],
        postgresql_where=sa.text(_STALLED),
        sqlite_where=sa.text(_STALLED),
    )
    op.create_index(
        "ix_jobs_recurring",
        "jobs",
        ["id"],
        postgresql_where=sa.text(_RECURRING),
        sqlite_where=sa.text(_RECURRING),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_recurring", table_name="jobs")
    op.drop_index("ix_jobs_stalled", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("schedule_stalled_at")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("missed_at")
