"""ui_sessions: the dashboard's sign-in sessions, shared by every API node

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 22:00:00

One row per signed-in browser (``cronwheel/ui/sessions.py``): the SHA-256 of its
cookie's token, the hash of the API key it signed in with, the tenant it looks at and
when it expires.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime, Uuid

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("tenant_id", Uuid),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("last_seen_at", UtcDateTime, nullable=False),
        sa.Column("expires_at", UtcDateTime, nullable=False),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_ui_sessions")),
    )
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("ui_sessions")
