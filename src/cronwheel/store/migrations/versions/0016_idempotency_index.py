"""idempotency index: only the jobs created with a key

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 14:00:00

``jobs (tenant_id, idempotency_key)`` was a unique constraint over every job, so each
job created without a key (nearly all: batches never carry one) added an entry
``(tenant, NULL)`` to it — index work on every create, for nothing a look-up reads. And
its tenant-only prefix made it a trap for the foreign key check of each new run
(``runs (tenant_id, job_id) → jobs (tenant_id, id)``): while the planner's statistics
still saw a small ``jobs`` (a new deployment, a burst of creates), it picked this index
with only ``tenant_id`` as the condition and walked the tenant's keyless jobs for every
run — 2 to 4 ms a check, seconds for a batch of 1,000. A unique index on the jobs that
have a key enforces the same rule (NULLs never collide) and no check can use it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_NAME = "uq_jobs_tenant_id_idempotency_key"
_KEYED = "idempotency_key IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(_NAME, type_="unique")
    op.create_index(
        _NAME,
        "jobs",
        ["tenant_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text(_KEYED),
        sqlite_where=sa.text(_KEYED),
    )


def downgrade() -> None:
    op.drop_index(_NAME, table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.create_unique_constraint(_NAME, ["tenant_id", "idempotency_key"])
