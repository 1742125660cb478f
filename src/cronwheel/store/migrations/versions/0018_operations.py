"""operations: bulk operations and their progress

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 18:00:00

One row per bulk operation (``domain/bulk.py``): what it was asked to do, by whom, how
far it got, and which API node carries it out (a lease).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Json, UtcDateTime, Uuid

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_OPEN = "state IN ('pending', 'running')"


def upgrade() -> None:
    op.create_table(
        "operations",
        sa.Column("id", Uuid, nullable=False),
        sa.Column("tenant_id", Uuid, nullable=False),
        sa.Column("action", sa.String(20), nullable=False),
        sa.Column("selector", Json, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("request_id", sa.String(200)),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("accepted_at", UtcDateTime, nullable=False),
        sa.Column("started_at", UtcDateTime),
        sa.Column("finished_at", UtcDateTime),
        sa.Column("matched", sa.Integer, nullable=False, server_default="0"),
        sa.Column("changed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("skipped", Json, nullable=False),
        sa.Column("details", Json, nullable=False),
        sa.Column("cursor", Uuid),
        sa.Column("owner", sa.String(200)),
        sa.Column("lease_expires_at", UtcDateTime),
        sa.Column("error", sa.Text),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operations")),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_operations_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'failed')", name=op.f("ck_operations_state")
        ),
    )
    op.create_index("ix_operations_tenant", "operations", ["tenant_id", "id"])
    op.create_index(
        "ix_operations_open",
        "operations",
        ["accepted_at"],
        postgresql_where=sa.text(_OPEN),
        sqlite_where=sa.text(_OPEN),
    )


def downgrade() -> None:
    op.drop_table("operations")
