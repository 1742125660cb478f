"""tenant indexes: foreign keys that lead with the tenant

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 08:00:00

A foreign key's ON DELETE action looks up the referencing rows of each deleted row by
the key's columns. ``attempts.run_id → runs.id`` and ``runs.job_id → jobs.id`` had no
index led by those columns (every index of those tables leads with ``tenant_id``), so
deleting one job's runs read every tenant's attempts, sequentially, once per run, and
every tenant's runs' index for the job. The keys now carry the tenant —
``(tenant_id, run_id) → runs (tenant_id, id)`` and ``(tenant_id, job_id) → jobs
(tenant_id, id)`` — so each lookup is an index range within the tenant
(``ix_attempts_run``, ``ix_runs_tenant_job``); the referenced ``(tenant_id, id)`` indexes
become unique, as a key needs (they were unique already: ``id`` is).
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_runs_tenant_id", table_name="runs")
    op.create_index("ix_runs_tenant_id", "runs", ["tenant_id", "id"], unique=True)
    op.drop_index("ix_jobs_tenant_id_id", table_name="jobs")
    op.create_index("ix_jobs_tenant_id_id", "jobs", ["tenant_id", "id"], unique=True)
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_job_id_jobs", type_="foreignkey")
        batch.create_foreign_key(
            "fk_runs_tenant_id_jobs",
            "jobs",
            ["tenant_id", "job_id"],
            ["tenant_id", "id"],
            ondelete="CASCADE",
        )
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("fk_attempts_run_id_runs", type_="foreignkey")
        batch.create_foreign_key(
            "fk_attempts_tenant_id_runs",
            "runs",
            ["tenant_id", "run_id"],
            ["tenant_id", "id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("fk_attempts_tenant_id_runs", type_="foreignkey")
        batch.create_foreign_key(
            "fk_attempts_run_id_runs", "runs", ["run_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_tenant_id_jobs", type_="foreignkey")
        batch.create_foreign_key(
            "fk_runs_job_id_jobs", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
        )
    op.drop_index("ix_jobs_tenant_id_id", table_name="jobs")
    op.create_index("ix_jobs_tenant_id_id", "jobs", ["tenant_id", "id"], unique=False)
    op.drop_index("ix_runs_tenant_id", table_name="runs")
    op.create_index("ix_runs_tenant_id", "runs", ["tenant_id", "id"], unique=False)
