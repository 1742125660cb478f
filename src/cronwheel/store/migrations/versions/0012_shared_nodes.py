"""api_keys.bootstrap: the admin key a deployment makes for itself lives in the
database (hashed), made once, so every API node knows it; log_chunks: worker logs in
the database, so every API node reads every line (partitioned by day on PostgreSQL)

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-02 08:00:00

No partition of ``log_chunks`` is made here: the API nodes that write logs make each
day's ahead of it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Uuid

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("bootstrap", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.create_check_constraint(
            "bootstrap", "NOT bootstrap OR (role = 'admin' AND tenant_id IS NULL)"
        )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant_id", "id"])
    op.create_index(
        "uq_api_keys_bootstrap",
        "api_keys",
        ["bootstrap"],
        unique=True,
        postgresql_where=sa.text("bootstrap"),
        sqlite_where=sa.text("bootstrap"),
    )
    op.create_table(
        "log_chunks",
        sa.Column("tenant_id", Uuid, nullable=False),
        sa.Column("run_id", Uuid, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("marker", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "run_id", "attempt", "seq", "day", name="pk_log_chunks"
        ),
        postgresql_partition_by="RANGE (day)",
    )


def downgrade() -> None:
    op.drop_table("log_chunks")
    op.drop_index("uq_api_keys_bootstrap", table_name="api_keys")
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("bootstrap", type_="check")
        batch.drop_column("bootstrap")
