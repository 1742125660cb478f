"""overrides: runtime parameter overrides of jobs and runs

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 19:30:00

One row per override (``domain/overrides.py``), kept after it is consumed or removed
so that a run's ``overrides`` can always say what made it. ``runs.overrides`` holds, for
a run some override reached, their ids in the merge order and the run's base;
``jobs.overrides`` the job's ``future`` overrides as a new run takes them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Json, UtcDateTime, Uuid

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "overrides",
        sa.Column("id", Uuid, nullable=False),
        sa.Column("tenant_id", Uuid, nullable=False),
        sa.Column("job_id", Uuid, nullable=False),
        sa.Column("run_id", Uuid),
        sa.Column("scope", sa.String(10), nullable=False),
        sa.Column("payload", Json),
        sa.Column("timeout", sa.Float),
        sa.Column("priority", sa.SmallInteger),
        sa.Column("pool", sa.String(100)),
        sa.Column("reason", sa.Text),
        sa.Column("created_by", sa.String(200)),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("removed_by", sa.String(200)),
        sa.Column("removed_at", UtcDateTime),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_overrides")),
        sa.ForeignKeyConstraint(
            ["tenant_id", "job_id"],
            ["jobs.tenant_id", "jobs.id"],
            name=op.f("fk_overrides_tenant_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("scope IN ('run', 'next', 'future')", name=op.f("ck_overrides_scope")),
    )
    op.create_index("ix_overrides_job", "overrides", ["tenant_id", "job_id", "id"])
    op.add_column("runs", sa.Column("overrides", Json))
    op.add_column("jobs", sa.Column("overrides", Json))


def downgrade() -> None:
    for table in ("jobs", "runs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("overrides")
    op.drop_table("overrides")
