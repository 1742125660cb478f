"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 08:51:31.989551
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from cronwheel.store.schema import UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("fencing_tokens")))
    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_counters")),
    )
    op.execute("INSERT INTO counters (name, value) VALUES ('fencing_token', 0)")
    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("attempt_id", sa.Uuid(), nullable=True),
        sa.Column("from_state", sa.String(length=20), nullable=True),
        sa.Column("to_state", sa.String(length=20), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_run", "events", ["tenant_id", "run_id", "id"], unique=False)
    op.create_index("ix_events_tenant", "events", ["tenant_id", "id"], unique=False)
    op.create_table(
        "shard_leases",
        sa.Column("shard", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("shard", name=op.f("pk_shard_leases")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "limits",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("webhook_secret", sa.String(length=100), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=20), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint(
            "role = 'worker' OR role = 'admin' OR tenant_id IS NOT NULL",
            name=op.f("ck_api_keys_scope"),
        ),
        sa.CheckConstraint(
            "role IN ('admin', 'operator', 'viewer', 'worker')", name=op.f("ck_api_keys_role")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column(
            "schedule",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "template",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "tags",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("next_due_at", UtcDateTime(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.CheckConstraint(
            "state IN ('active', 'paused', 'cancelled', 'finished')", name=op.f("ck_jobs_state")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_jobs_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint(
            "tenant_id", "idempotency_key", name=op.f("uq_jobs_tenant_id_idempotency_key")
        ),
    )
    op.create_index(op.f("ix_jobs_tenant_id_id"), "jobs", ["tenant_id", "id"], unique=False)
    op.create_index(op.f("ix_jobs_tenant_id_name"), "jobs", ["tenant_id", "name"], unique=False)
    op.create_table(
        "workers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("pool", sa.String(length=100), nullable=False),
        sa.Column(
            "capabilities",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "tags",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("registered_at", UtcDateTime(), nullable=False),
        sa.Column("last_seen_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_workers_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index("ix_workers_pool", "workers", ["pool", "last_seen_at"], unique=False)
    op.create_table(
        "runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("job_name", sa.String(length=200), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("due_local", sa.String(length=40), nullable=True),
        sa.Column("fire_at", UtcDateTime(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("pool", sa.String(length=100), nullable=False),
        sa.Column(
            "requires",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "tags",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("task", sa.String(length=200), nullable=True),
        sa.Column(
            "webhook",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column(
            "retry",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("timeout", sa.Float(), nullable=False),
        sa.Column("heartbeat_timeout", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("dispatched_at", UtcDateTime(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint(
            "(finished_at IS NOT NULL) = (state IN ('CANCELLED', 'DEAD_LETTER', 'FAILED', 'SKIPPED', 'SUCCESS'))",
            name=op.f("ck_runs_finished_iff_terminal"),
        ),
        sa.CheckConstraint(
            "state IN ('CANCELLED', 'DEAD_LETTER', 'DISPATCHED', 'FAILED', 'RUNNING', 'SCHEDULED', 'SKIPPED', 'SUCCESS')",
            name=op.f("ck_runs_state"),
        ),
        sa.CheckConstraint("priority >= 0 AND priority <= 3", name=op.f("ck_runs_priority")),
        sa.CheckConstraint("shard >= 0 AND shard < 256", name=op.f("ck_runs_shard")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint(
            "tenant_id", "job_id", "due_at", name=op.f("uq_runs_tenant_id_job_id_due_at")
        ),
    )
    op.create_index(
        "ix_runs_due",
        "runs",
        ["shard", "fire_at"],
        unique=False,
        postgresql_where=sa.text("state = 'SCHEDULED'"),
        sqlite_where=sa.text("state = 'SCHEDULED'"),
    )
    op.create_index(
        "ix_runs_ready",
        "runs",
        ["pool", "priority", "fire_at"],
        unique=False,
        postgresql_where=sa.text("state = 'DISPATCHED'"),
        sqlite_where=sa.text("state = 'DISPATCHED'"),
    )
    op.create_index("ix_runs_tenant_id", "runs", ["tenant_id", "id"], unique=False)
    op.create_index("ix_runs_tenant_job", "runs", ["tenant_id", "job_id", "id"], unique=False)
    op.create_index("ix_runs_tenant_state", "runs", ["tenant_id", "state", "id"], unique=False)
    op.create_table(
        "attempts",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Uuid(), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("lease_expires_at", UtcDateTime(), nullable=False),
        sa.Column("deadline", UtcDateTime(), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.CheckConstraint(
            "state IN ('CANCELLED', 'FAILED', 'LOST', 'RELEASED', 'RUNNING', 'SUCCEEDED', 'TIMED_OUT')",
            name=op.f("ck_attempts_state"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_attempts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("fencing_token", name=op.f("uq_attempts_fencing_token")),
    )
    op.create_index(
        "ix_attempts_deadline",
        "attempts",
        ["deadline"],
        unique=False,
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )
    op.create_index(
        "ix_attempts_live",
        "attempts",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )
    op.create_index("ix_attempts_run", "attempts", ["tenant_id", "run_id", "number"], unique=False)
    op.create_index(
        "ix_attempts_worker",
        "attempts",
        ["worker_id"],
        unique=False,
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence("fencing_tokens")))
    op.drop_index(
        "ix_attempts_worker",
        table_name="attempts",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )
    op.drop_index("ix_attempts_run", table_name="attempts")
    op.drop_index(
        "ix_attempts_live",
        table_name="attempts",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )
    op.drop_index(
        "ix_attempts_deadline",
        table_name="attempts",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    )
    op.drop_table("attempts")
    op.drop_index("ix_runs_tenant_state", table_name="runs")
    op.drop_index("ix_runs_tenant_job", table_name="runs")
    op.drop_index("ix_runs_tenant_id", table_name="runs")
    op.drop_index(
        "ix_runs_ready",
        table_name="runs",
        postgresql_where=sa.text("state = 'DISPATCHED'"),
        sqlite_where=sa.text("state = 'DISPATCHED'"),
    )
    op.drop_index(
        "ix_runs_due",
        table_name="runs",
        postgresql_where=sa.text("state = 'SCHEDULED'"),
        sqlite_where=sa.text("state = 'SCHEDULED'"),
    )
    op.drop_table("runs")
    op.drop_index("ix_workers_pool", table_name="workers")
    op.drop_table("workers")
    op.drop_index(op.f("ix_jobs_tenant_id_name"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_tenant_id_id"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("shard_leases")
    op.drop_index("ix_events_tenant", table_name="events")
    op.drop_index("ix_events_run", table_name="events")
    op.drop_table("events")
    op.drop_table("counters")
