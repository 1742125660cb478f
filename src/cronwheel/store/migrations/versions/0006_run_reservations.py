"""runs.reserved_*: a run dispatched ahead of its instant can be reserved for one
worker, which starts it at its instant by confirming (a cancel or pause wins before);
a reserved run leaves the ready queue's index

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime, Uuid

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_RESERVED = "reserved_token IS NOT NULL"
_READY_BEFORE = "state = 'DISPATCHED'"
_READY = "state = 'DISPATCHED' AND reserved_token IS NULL"


def _ready_index(predicate: str) -> None:
    op.drop_index("ix_runs_ready", table_name="runs")
    op.create_index(
        "ix_runs_ready",
        "runs",
        ["pool", "priority", "fire_at"],
        postgresql_where=sa.text(predicate),
        sqlite_where=sa.text(predicate),
    )


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("reserved_by", Uuid, nullable=True))
        batch.add_column(sa.Column("reserved_attempt", Uuid, nullable=True))
        batch.add_column(sa.Column("reserved_token", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("reserved_until", UtcDateTime(), nullable=True))
    op.create_index(
        "ix_runs_reserved",
        "runs",
        ["reserved_token"],
        postgresql_where=sa.text(_RESERVED),
        sqlite_where=sa.text(_RESERVED),
    )
    # A reserved run is not in the ready queue.
    _ready_index(_READY)


def downgrade() -> None:
    _ready_index(_READY_BEFORE)
    op.drop_index("ix_runs_reserved", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        for column in ("reserved_until", "reserved_token", "reserved_attempt", "reserved_by"):
            batch.drop_column(column)
