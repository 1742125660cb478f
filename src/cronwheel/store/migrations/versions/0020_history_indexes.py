"""history indexes: the run history by due instant, one index fewer

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 22:30:00

The run history (``GET /v1/runs``, docs/history.md) lists newest first by
``(due_at, id)``. Each listing is one index range walked backwards:

* a tenant's runs, by due window, tag or pool: ``ix_runs_tenant_due (tenant_id, due_at,
  id)``, new;
* by state: ``ix_runs_tenant_state``, was ``(tenant_id, state, id)``, now ``(tenant_id,
  state, due_at, id)`` (counting pending runs still reads its (tenant, state) prefix);
* by job: the unique key ``(tenant_id, job_id, due_at)``, there since 0001 (``due_at`` is
  unique within a job).

``ix_runs_tenant_job (tenant_id, job_id, id)`` goes: the unique key leads with the same
``(tenant_id, job_id)``, which is all the foreign key to the job (its ON DELETE CASCADE)
and every read of a job's runs need. So runs keep as many index entries per row as
before — a run's insert and each of its state changes write no more.
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_runs_tenant_job", table_name="runs")
    op.drop_index("ix_runs_tenant_state", table_name="runs")
    op.create_index("ix_runs_tenant_state", "runs", ["tenant_id", "state", "due_at", "id"])
    op.create_index("ix_runs_tenant_due", "runs", ["tenant_id", "due_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_tenant_due", table_name="runs")
    op.drop_index("ix_runs_tenant_state", table_name="runs")
    op.create_index("ix_runs_tenant_state", "runs", ["tenant_id", "state", "id"])
    op.create_index("ix_runs_tenant_job", "runs", ["tenant_id", "job_id", "id"])
