"""runs.quarantined_at: a run a step of a scheduler pass failed on alone is taken out
of the pass (DEAD_LETTER, the error kept) instead of failing the pass for everyone;
stored catch-up windows are held to the new bound

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 18:00:00

A job stored before the input bounds may carry a ``catch_up_window`` past 366 days; the
scheduler validates a job's schedule each time it fires it, so such a job would now be
quarantined at its next firing. Its window is brought to the bound instead (a window
that long never differed in practice: at most 1,000 missed occurrences are replayed one
by one). Each change goes on the job's audit trail.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from cronwheel.domain.bounds import CATCH_UP_WINDOW_MAX
from cronwheel.store.schema import Json, UtcDateTime, Uuid

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_QUARANTINED = "quarantined_at IS NOT NULL"

_jobs = sa.table(
    "jobs",
    sa.column("id", Uuid),
    sa.column("tenant_id", Uuid),
    sa.column("state", sa.String),
    sa.column("kind", sa.String),
    sa.column("schedule", Json),
    sa.column("version", sa.Integer),
    sa.column("updated_at", UtcDateTime),
)
_events = sa.table(
    "events",
    sa.column("tenant_id", Uuid),
    sa.column("at", UtcDateTime),
    sa.column("kind", sa.String),
    sa.column("job_id", Uuid),
    sa.column("actor", sa.String),
    sa.column("reason", sa.Text),
    sa.column("data", Json),
)


def _hold_catch_up_windows() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_jobs.c.id, _jobs.c.tenant_id, _jobs.c.schedule, _jobs.c.version).where(
            _jobs.c.kind.in_(("cron", "interval")), _jobs.c.state.in_(("active", "paused"))
        )
    ).all()
    at = datetime.now(UTC)
    for row in rows:
        window = row.schedule.get("catch_up_window")
        if not isinstance(window, int | float) or window <= CATCH_UP_WINDOW_MAX:
            continue
        schedule = {**row.schedule, "catch_up_window": CATCH_UP_WINDOW_MAX}
        bind.execute(
            _jobs.update()
            .where(_jobs.c.id == row.id)
            .values(schedule=schedule, version=row.version + 1, updated_at=at)
        )
        bind.execute(
            _events.insert().values(
                tenant_id=row.tenant_id,
                at=at,
                kind="job.schedule_rewritten",
                job_id=row.id,
                actor="migration 0009",
                reason="catch_up_window held to its bound of 366 days",
                data={"catch_up_window": {"before": window, "after": CATCH_UP_WINDOW_MAX}},
            )
        )


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("quarantined_at", UtcDateTime(), nullable=True))
    op.create_index(
        "ix_runs_quarantined",
        "runs",
        ["tenant_id", "quarantined_at"],
        postgresql_where=sa.text(_QUARANTINED),
        sqlite_where=sa.text(_QUARANTINED),
    )
    _hold_catch_up_windows()


def downgrade() -> None:
    op.drop_index("ix_runs_quarantined", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("quarantined_at")
