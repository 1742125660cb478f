"""audit: the append-only trail of every change

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 17:00:00

One record per change made through the API (``domain/audit.py``). On PostgreSQL a
trigger makes the table append-only: UPDATE and TRUNCATE are refused, and DELETE too
unless the transaction set ``cronwheel.audit_retention`` to ``on`` — what retention
does, and nothing else in cronwheel.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Json, UtcDateTime, Uuid

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_GUARD = """
CREATE FUNCTION audit_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('cronwheel.audit_retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", UtcDateTime, nullable=False),
        sa.Column("tenant_id", Uuid),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("role", sa.String(20)),
        sa.Column("key_id", Uuid),
        sa.Column("request_id", sa.String(200)),
        sa.Column("action", sa.String(60), nullable=False),
        sa.Column("target_kind", sa.String(20), nullable=False),
        sa.Column("target_id", sa.String(200)),
        sa.Column("reason", sa.Text),
        sa.Column("before", Json),
        sa.Column("after", Json),
    )
    op.create_index("ix_audit_tenant", "audit", ["tenant_id", "id"])
    op.create_index("ix_audit_target", "audit", ["target_id", "id"])
    if op.get_context().dialect.name == "postgresql":
        op.execute(_GUARD)
        op.execute(
            "CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit"
            " FOR EACH ROW EXECUTE FUNCTION audit_guard()"
        )
        op.execute(
            "CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit"
            " FOR EACH STATEMENT EXECUTE FUNCTION audit_guard()"
        )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_no_truncate ON audit")
        op.execute("DROP TRIGGER audit_append_only ON audit")
        op.execute("DROP FUNCTION audit_guard()")
    op.drop_table("audit")
