"""admission: per-pool settings, fair-share passes, token buckets, and a ready queue
walked per tenant

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 07:00:00

- ``pools``: what an admin sets per pool (the share of worker slots reserved for P0);
  a pool without a row takes the deployment's defaults.
- ``fair_shares`` and ``fair_clocks``: the stride-scheduling state of weighted fair
  share — a pass per (pool, priority class, tenant), and per (pool, class) the virtual
  time a returning tenant's pass is brought up to.
- ``rate_buckets``: token buckets kept in the database, so that every API and
  scheduler node draws on the same allowance (a tenant's dispatch rate, a key's
  request rate).
- The ready queue's index leads with the tenant after the pool, so that leasing takes
  each competing tenant's head of the queue by index, however long another tenant's
  queue is; reservations get an index by tenant, for counting what a tenant holds.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import UtcDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The predicates as they stand at this revision.
READY = "state = 'DISPATCHED' AND reserved_token IS NULL"
RESERVED = "reserved_token IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("p0_reserved_share", sa.Float(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
        sa.CheckConstraint(
            "p0_reserved_share IS NULL OR (p0_reserved_share >= 0 AND p0_reserved_share <= 1)",
            name=op.f("ck_pools_p0_reserved_share"),
        ),
    )
    op.create_table(
        "fair_shares",
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("pass", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("pool", "priority", "tenant_id", name=op.f("pk_fair_shares")),
    )
    op.create_table(
        "fair_clocks",
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("vtime", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("pool", "priority", name=op.f("pk_fair_clocks")),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("stamp", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_rate_buckets")),
    )
    op.drop_index("ix_runs_ready", table_name="runs")
    op.create_index(
        "ix_runs_ready",
        "runs",
        ["pool", "tenant_id", "priority", "fire_at"],
        postgresql_where=sa.text(READY),
        sqlite_where=sa.text(READY),
    )
    op.create_index(
        "ix_runs_reserved_tenant",
        "runs",
        ["tenant_id"],
        postgresql_where=sa.text(RESERVED),
        sqlite_where=sa.text(RESERVED),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_reserved_tenant", table_name="runs")
    op.drop_index("ix_runs_ready", table_name="runs")
    op.create_index(
        "ix_runs_ready",
        "runs",
        ["pool", "priority", "fire_at"],
        postgresql_where=sa.text(READY),
        sqlite_where=sa.text(READY),
    )
    op.drop_table("rate_buckets")
    op.drop_table("fair_clocks")
    op.drop_table("fair_shares")
    op.drop_table("pools")
