"""The schema: one SQLAlchemy Core ``MetaData`` for PostgreSQL and SQLite.

The same columns everywhere; only types differ (JSONB and TIMESTAMPTZ on PostgreSQL,
JSON text and ISO text on SQLite). Every instant is stored in UTC. Tenant-scoped
indexes and unique keys lead with ``tenant_id``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.domain.states import TERMINAL_STATES, AttemptState, RunState

__all__ = [
    "AUDIT_RETENTION_SETTING",
    "FENCING_SEQUENCE",
    "GATED",
    "NO_RESERVATION",
    "NUM_SHARDS",
    "OPEN_OPERATION",
    "PARKED_FIRE_AT",
    "PROGRESS_LIVE",
    "QUARANTINED",
    "READY",
    "RECURRING",
    "RESERVED",
    "STALLED",
    "Json",
    "OptionalJson",
    "UtcDateTime",
    "Uuid",
    "api_keys",
    "attempt_tombstones",
    "attempts",
    "audit",
    "counters",
    "events",
    "fair_clocks",
    "fair_shares",
    "jobs",
    "log_chunks",
    "metadata",
    "operations",
    "overrides",
    "pools",
    "rate_buckets",
    "runs",
    "scheduler_nodes",
    "shard_leases",
    "tenants",
    "ui_sessions",
    "workers",
]


class UtcDateTime(sa.TypeDecorator[datetime]):
    """An aware UTC instant in and out, on both dialects (SQLite keeps naive UTC text)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware instant")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        instant: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        if instant.tzinfo is None:
            return instant.replace(tzinfo=UTC)
        return instant.astimezone(UTC)


Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# A JSON column whose Python None is SQL NULL (``Json`` writes a given None as JSON
# ``null``): for values that are either there or not.
OptionalJson = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql"
)
Uuid = sa.Uuid(as_uuid=True)

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

FENCING_SEQUENCE = sa.Sequence("fencing_tokens", metadata=metadata)


def _in(column: str, values: Any) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in sorted(values))})"


tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("limits", Json, nullable=False),
    sa.Column("webhook_secret", sa.String(100), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, sa.ForeignKey("tenants.id", ondelete="CASCADE")),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("prefix", sa.String(20), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("revoked_at", UtcDateTime),
    # The admin key a deployment made for itself on first start (when no admin key is
    # configured): at most one row, whichever API node got there first.
    sa.Column("bootstrap", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.CheckConstraint("role IN ('admin', 'operator', 'viewer', 'worker')", name="role"),
    sa.CheckConstraint("role = 'worker' OR role = 'admin' OR tenant_id IS NOT NULL", name="scope"),
    sa.CheckConstraint("NOT bootstrap OR (role = 'admin' AND tenant_id IS NULL)", name="bootstrap"),
    sa.Index("ix_api_keys_tenant", "tenant_id", "id"),
    sa.Index(
        "uq_api_keys_bootstrap",
        "bootstrap",
        unique=True,
        postgresql_where=sa.text("bootstrap"),
        sqlite_where=sa.text("bootstrap"),
    ),
)

# The predicates of the jobs' indexes for stalled-schedule detection (docs/alerts.md).
STALLED = "schedule_stalled_at IS NOT NULL"
RECURRING = "state = 'active' AND kind IN ('cron', 'interval')"

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("kind", sa.String(10), nullable=False),
    sa.Column("schedule", Json, nullable=False),
    sa.Column("template", Json, nullable=False),
    sa.Column("tags", Json, nullable=False),
    sa.Column("version", sa.Integer, nullable=False, server_default="1"),
    sa.Column("next_due_at", UtcDateTime),
    sa.Column("idempotency_key", sa.String(200)),
    sa.Column("request_hash", sa.String(64)),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    # The job's ``future`` overrides as a new run takes them (``domain/overrides.py``):
    # ``{"ids": [...], "base": {...}, "fields": {...}}``, the fields the base becomes;
    # None (nearly every job) for none.
    sa.Column("overrides", OptionalJson),
    # When the scheduler found the job's schedule stalled: active, recurring, no run to
    # fire its next occurrence, that occurrence past the lateness budget (migration
    # 0021, docs/alerts.md). Cleared when the schedule produces again.
    sa.Column("schedule_stalled_at", UtcDateTime),
    # A workflow's DAG (``domain/workflow.Dag``'s JSON, migration 0023): the job is a
    # workflow, its runs workflow runs and node runs. None for every other job.
    sa.Column("workflow", OptionalJson),
    # Only the jobs created with a key (migration 0016): a keyless job adds no entry,
    # and no look-up by tenant alone can take this index.
    sa.Index(
        "uq_jobs_tenant_id_idempotency_key",
        "tenant_id",
        "idempotency_key",
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
    ),
    # Unique: what the runs' key to their job refers to.
    sa.Index(None, "tenant_id", "id", unique=True),
    sa.Index(None, "tenant_id", "name"),
    # Stalled schedules: what the alerts read.
    sa.Index(
        "ix_jobs_stalled",
        "tenant_id",
        "schedule_stalled_at",
        postgresql_where=sa.text(STALLED),
        sqlite_where=sa.text(STALLED),
    ),
    # Active recurring jobs: what the stalled-schedule sweep walks, by id.
    sa.Index(
        "ix_jobs_recurring",
        "id",
        postgresql_where=sa.text(RECURRING),
        sqlite_where=sa.text(RECURRING),
    ),
    sa.CheckConstraint("state IN ('active', 'paused', 'cancelled', 'finished')", name="state"),
)

_TERMINAL = _in("state", TERMINAL_STATES)

# The predicate of the reservation index (see ``runs.reserved_*``): few rows, those
# reserved now and the odd one cancelled while reserved.
RESERVED = "reserved_token IS NOT NULL"
# The predicate of the ready queue's index: dispatched and not reserved.
READY = "state = 'DISPATCHED' AND reserved_token IS NULL"
# The predicate of the gated index: workflow nodes waiting for upstream nodes that are
# all under way, not reserved — what a worker may reserve ahead of their gate.
GATED = "state = 'PENDING' AND gated_at IS NOT NULL AND reserved_token IS NULL"

# The predicate of the quarantine index: runs a poison step took out of a pass.
QUARANTINED = "quarantined_at IS NOT NULL"

# Dispatching a run anew voids whatever reservation an earlier stint left behind.
# The fire time of a paused job's runs: beyond every due window, and still a valid
# timestamp on both backends (see ``store/sql/jobs.py``).
PARKED_FIRE_AT = datetime(9999, 1, 1, tzinfo=UTC)

NO_RESERVATION: dict[str, None] = {
    "reserved_by": None,
    "reserved_attempt": None,
    "reserved_token": None,
    "reserved_until": None,
}

# The predicate of the progress index: live attempts under a progress timeout.
PROGRESS_LIVE = "state = 'RUNNING' AND progress_deadline IS NOT NULL"

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, nullable=False),
    sa.Column("job_id", Uuid, nullable=False),
    sa.Column("job_name", sa.String(200), nullable=False),
    # once | schedule | trigger | backfill | replay: only "schedule" runs materialise the
    # job's next occurrence and are subject to its catch-up and overlap policies.
    sa.Column("origin", sa.String(10), nullable=False, server_default="once"),
    sa.Column("shard", sa.SmallInteger, nullable=False),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("due_at", UtcDateTime, nullable=False),
    sa.Column("due_local", sa.String(40)),
    sa.Column("fire_at", UtcDateTime, nullable=False),
    sa.Column("priority", sa.SmallInteger, nullable=False),
    sa.Column("pool", sa.String(100), nullable=False),
    sa.Column("requires", Json, nullable=False),
    sa.Column("tags", Json, nullable=False),
    # Labels a worker's tags must all include for it to lease the run (its job's
    # ``route_tags``); ``tags`` only label and filter.
    sa.Column("route_tags", Json, nullable=False, server_default="[]"),
    sa.Column("task", sa.String(200)),
    sa.Column("webhook", Json),
    sa.Column("payload", Json, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("retry", Json, nullable=False),
    sa.Column("timeout", sa.Float, nullable=False),
    sa.Column("heartbeat_timeout", sa.Float, nullable=False),
    # Seconds the handler may go without reporting progress (None: no bound).
    sa.Column("progress_timeout", sa.Float),
    sa.Column("reason", sa.Text),
    # Why a DISPATCHED run is still waiting: no live worker can take it (set and cleared
    # by the scheduler's routing check, cleared by leasing).
    sa.Column("wait_reason", sa.Text),
    # A reservation: the run, DISPATCHED ahead of its instant, is held for one worker
    # (``reserved_by``) under the attempt id and fencing token it will start with; the
    # worker starts it at ``fire_at`` or later by confirming (a cancel or pause before
    # then wins). Unconfirmed by ``reserved_until``, it is free for any worker again.
    # Cleared whenever the run is dispatched anew, so only the current stint's counts.
    sa.Column("reserved_by", Uuid),
    sa.Column("reserved_attempt", Uuid),
    sa.Column("reserved_token", sa.BigInteger),
    sa.Column("reserved_until", UtcDateTime),
    # A workflow's node run (PENDING) whose upstream nodes are all under way: since
    # when it may be reserved before it is ready, gated (migration 0024). And a workflow
    # run's: the gates of its nodes that opened while reserved — their holders begin
    # them, and record their starts after (``store/sql/gates.py``).
    sa.Column("gated_at", UtcDateTime),
    sa.Column("gates", OptionalJson),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    # Fired while an earlier run of its job (overlap=queue_one) was still going: it
    # waits for that run, and no other occurrence queues beside it.
    sa.Column("overlap_queued", sa.Boolean, nullable=False, server_default=sa.false()),
    # Set when a step of a scheduler pass failed on this run alone (a poison row): the
    # run was taken out of the pass as a DEAD_LETTER, the error in ``reason`` and
    # ``last_error``. Cleared by a redrive.
    sa.Column("quarantined_at", UtcDateTime),
    # When the scheduler found the run undispatched past its fire time plus its job's
    # lateness budget (migration 0021): the ``run.missed`` event was written then. A
    # run is missed now while SCHEDULED with ``missed_at >= fire_at`` (a retry or a
    # resumed job's later fire time is a new stint).
    sa.Column("missed_at", UtcDateTime),
    sa.Column("result", Json),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("dispatched_at", UtcDateTime),
    sa.Column("started_at", UtcDateTime),
    sa.Column("finished_at", UtcDateTime),
    # The overrides that reached the run (``domain/overrides.py``): ``{"ids": [...] in
    # the merge order, "base": {...}}``, what its own columns were before them. None for
    # none.
    sa.Column("overrides", OptionalJson),
    # A workflow's node run (migration 0023): the workflow run it belongs to, and its
    # node's name. Every other run: None and ''. The node is part of the unique key, so
    # the nodes of one workflow run may share a due instant with each other and with it.
    sa.Column("workflow_run_id", Uuid),
    sa.Column("node", sa.String(100), nullable=False, server_default=""),
    sa.UniqueConstraint("tenant_id", "job_id", "due_at", "node"),
    # Keys lead with the tenant, as indexes do: deleting a job looks its runs up by
    # (tenant, job), within the tenant (migration 0015).
    sa.ForeignKeyConstraint(
        ["tenant_id", "job_id"], ["jobs.tenant_id", "jobs.id"], ondelete="CASCADE"
    ),
    sa.CheckConstraint(_in("state", RunState), name="state"),
    sa.CheckConstraint(f"(finished_at IS NOT NULL) = ({_TERMINAL})", name="finished_iff_terminal"),
    sa.CheckConstraint("shard >= 0 AND shard < 256", name="shard"),
    sa.CheckConstraint(
        "origin IN ('once', 'schedule', 'trigger', 'backfill', 'replay', 'node')", name="origin"
    ),
    sa.CheckConstraint("priority >= 0 AND priority <= 3", name="priority"),
    # The scheduler's due window: an index range scan per shard.
    sa.Index(
        "ix_runs_due",
        "shard",
        "fire_at",
        postgresql_where=sa.text("state = 'SCHEDULED'"),
        sqlite_where=sa.text("state = 'SCHEDULED'"),
    ),
    # What workers lease: ready runs by pool, then tenant (leasing takes each competing
    # tenant's head by index, docs/admission.md), highest priority first, oldest first.
    # (A reserved run is held for one worker: not in the queue until its reservation
    # is used, handed back or lapses.)
    sa.Index(
        "ix_runs_ready",
        "pool",
        "tenant_id",
        "priority",
        "fire_at",
        postgresql_where=sa.text(READY),
        sqlite_where=sa.text(READY),
    ),
    # Gated nodes a worker may reserve ahead of their upstream nodes' end, as the ready
    # queue is walked: by pool, tenant, class and age.
    sa.Index(
        "ix_runs_gated",
        "pool",
        "tenant_id",
        "priority",
        "fire_at",
        postgresql_where=sa.text(GATED),
        sqlite_where=sa.text(GATED),
    ),
    # Runs waiting with a reason: what the alerts and the unroutable gauge read.
    sa.Index(
        "ix_runs_waiting",
        "tenant_id",
        "pool",
        postgresql_where=sa.text("wait_reason IS NOT NULL"),
        sqlite_where=sa.text("wait_reason IS NOT NULL"),
    ),
    # Reservations by token: what starting and handing back a reservation find.
    sa.Index(
        "ix_runs_reserved",
        "reserved_token",
        postgresql_where=sa.text(RESERVED),
        sqlite_where=sa.text(RESERVED),
    ),
    # Reservations by tenant: what counting a tenant's leased runs reads.
    sa.Index(
        "ix_runs_reserved_tenant",
        "tenant_id",
        postgresql_where=sa.text(RESERVED),
        sqlite_where=sa.text(RESERVED),
    ),
    # Quarantined runs: what the alerts and the gauge read.
    sa.Index(
        "ix_runs_quarantined",
        "tenant_id",
        "quarantined_at",
        postgresql_where=sa.text(QUARANTINED),
        sqlite_where=sa.text(QUARANTINED),
    ),
    # Unique: what the attempts' key to their run refers to.
    sa.Index("ix_runs_tenant_id", "tenant_id", "id", unique=True),
    # The run history (docs/history.md), newest first by (due_at, id): a tenant's runs,
    # by state (also what counting pending runs reads). A job's runs are read by the
    # unique key (tenant_id, job_id, due_at) above, which also serves the key to the
    # job (its ON DELETE CASCADE): no index of its own (migration 0020).
    sa.Index("ix_runs_tenant_due", "tenant_id", "due_at", "id"),
    sa.Index("ix_runs_tenant_state", "tenant_id", "state", "due_at", "id"),
    # A workflow run's nodes: what advancing it and showing it read.
    sa.Index(
        "ix_runs_workflow",
        "workflow_run_id",
        "node",
        postgresql_where=sa.text("workflow_run_id IS NOT NULL"),
        sqlite_where=sa.text("workflow_run_id IS NOT NULL"),
    ),
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, nullable=False),
    sa.Column("run_id", Uuid, nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("worker_id", Uuid),
    sa.Column("fencing_token", sa.BigInteger, nullable=False, unique=True),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("lease_expires_at", UtcDateTime, nullable=False),
    sa.Column("deadline", UtcDateTime, nullable=False),
    sa.Column("started_at", UtcDateTime, nullable=False),
    sa.Column("heartbeat_at", UtcDateTime),
    sa.Column("finished_at", UtcDateTime),
    sa.Column("error", sa.Text),
    sa.Column("result", Json),
    # Progress reported by the handler: when last (server time) and its details. Under a
    # progress timeout, ``progress_deadline`` is the start, then the last report, plus
    # the timeout: past it the expiry sweep ends the attempt TIMED_OUT.
    sa.Column("progress_deadline", UtcDateTime),
    sa.Column("progress_at", UtcDateTime),
    sa.Column("progress_details", Json),
    sa.ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"], ondelete="CASCADE"
    ),
    sa.CheckConstraint(_in("state", AttemptState), name="state"),
    sa.Index("ix_attempts_run", "tenant_id", "run_id", "number"),
    sa.Index(
        "ix_attempts_live",
        "lease_expires_at",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    ),
    sa.Index(
        "ix_attempts_deadline",
        "deadline",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    ),
    # Only attempts under a progress timeout: the sweep's probe costs nothing for others.
    sa.Index(
        "ix_attempts_progress",
        "progress_deadline",
        postgresql_where=sa.text(PROGRESS_LIVE),
        sqlite_where=sa.text(PROGRESS_LIVE),
    ),
    sa.Index(
        "ix_attempts_worker",
        "worker_id",
        postgresql_where=sa.text("state = 'RUNNING'"),
        sqlite_where=sa.text("state = 'RUNNING'"),
    ),
)

# Attempts deleted with their run (its job or tenant deleted while the run was in
# progress): a worker's later report about one is refused as stale (409), like any
# attempt that is no longer its own, not as unknown. Kept ``TOMBSTONE_TTL``, longer
# than any attempt can live; purged by later deletions.
attempt_tombstones = sa.Table(
    "attempt_tombstones",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, nullable=False),
    sa.Column("deleted_at", UtcDateTime, nullable=False),
    sa.Index("ix_attempt_tombstones_deleted_at", "deleted_at"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("tenant_id", Uuid),
    sa.Column("at", UtcDateTime, nullable=False),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("job_id", Uuid),
    sa.Column("run_id", Uuid),
    sa.Column("attempt_id", Uuid),
    sa.Column("from_state", sa.String(20)),
    sa.Column("to_state", sa.String(20)),
    sa.Column("actor", sa.String(200)),
    sa.Column("reason", sa.Text),
    sa.Column("data", Json),
    sa.Index("ix_events_run", "tenant_id", "run_id", "id"),
    sa.Index("ix_events_tenant", "tenant_id", "id"),
)

# The audit trail (``domain/audit.py``): one record per change, written with it. No key
# to the tenant: records outlive what they name, and leave only by retention. On
# PostgreSQL a trigger (migration 0017) refuses every UPDATE, TRUNCATE and DELETE of it
# but a retention's, whose transaction sets ``AUDIT_RETENTION_SETTING`` to ``on``.
AUDIT_RETENTION_SETTING = "cronwheel.audit_retention"
audit = sa.Table(
    "audit",
    metadata,
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
    # A tenant's trail, newest first; one target's. (Retention walks the oldest by id:
    # every create writes a record, and an index on ``at`` would cost each one more.)
    sa.Index("ix_audit_tenant", "tenant_id", "id"),
    sa.Index("ix_audit_target", "target_id", "id"),
)

# Bulk operations (``domain/bulk.py``): what each was asked to do and how far it got. An
# open one (pending, running) is claimed by an API node for ``lease_expires_at``.
OPEN_OPERATION = "state IN ('pending', 'running')"
operations = sa.Table(
    "operations",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
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
    # Where a step goes on from, for the actions whose rows stay selectable (trigger).
    sa.Column("cursor", Uuid),
    sa.Column("owner", sa.String(200)),
    sa.Column("lease_expires_at", UtcDateTime),
    sa.Column("error", sa.Text),
    sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name="state"),
    sa.Index("ix_operations_tenant", "tenant_id", "id"),
    sa.Index(
        "ix_operations_open",
        "accepted_at",
        postgresql_where=sa.text(OPEN_OPERATION),
        sqlite_where=sa.text(OPEN_OPERATION),
    ),
)

overrides = sa.Table(
    "overrides",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, nullable=False),
    sa.Column("job_id", Uuid, nullable=False),
    # The run a ``run`` or ``next`` override is bound to; None for ``future``.
    sa.Column("run_id", Uuid),
    sa.Column("scope", sa.String(10), nullable=False),
    sa.Column("payload", OptionalJson),  # a merge-patch over the payload
    sa.Column("timeout", sa.Float),
    sa.Column("priority", sa.SmallInteger),
    sa.Column("pool", sa.String(100)),
    sa.Column("reason", sa.Text),
    sa.Column("created_by", sa.String(200)),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("removed_by", sa.String(200)),
    sa.Column("removed_at", UtcDateTime),
    sa.ForeignKeyConstraint(
        ["tenant_id", "job_id"], ["jobs.tenant_id", "jobs.id"], ondelete="CASCADE"
    ),
    sa.CheckConstraint("scope IN ('run', 'next', 'future')", name="scope"),
    sa.Index("ix_overrides_job", "tenant_id", "job_id", "id"),
)

workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("tenant_id", Uuid, sa.ForeignKey("tenants.id", ondelete="CASCADE")),
    sa.Column("name", sa.String(200)),
    sa.Column("pool", sa.String(100), nullable=False),
    sa.Column("capabilities", Json, nullable=False),
    sa.Column("tags", Json, nullable=False),
    sa.Column("capacity", sa.Integer, nullable=False),
    sa.Column("registered_at", UtcDateTime, nullable=False),
    sa.Column("last_seen_at", UtcDateTime, nullable=False),
    sa.Column("deregistered_at", UtcDateTime),
    # Calls webhooks only (no task handlers): not a candidate for a pool's task runs.
    sa.Column("webhooks_only", sa.Boolean, nullable=False, server_default=sa.false()),
    # The task names the worker runs (a JSON list); NULL: any task (a worker that
    # declared none, as before workers declared them).
    sa.Column("tasks", Json),
    sa.Index("ix_workers_pool", "pool", "last_seen_at"),
)

# What an admin sets per pool; a pool without a row takes the deployment's defaults.
pools = sa.Table(
    "pools",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    # The share of each worker's slots that only P0 runs may take (NULL: the default).
    sa.Column("p0_reserved_share", sa.Float),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.CheckConstraint(
        "p0_reserved_share IS NULL OR (p0_reserved_share >= 0 AND p0_reserved_share <= 1)",
        name="p0_reserved_share",
    ),
)

# Weighted fair share by stride scheduling (docs/admission.md): each tenant's pass in a
# (pool, priority class), advanced by 1/weight per run it is given; the lowest pass is
# served next.
fair_shares = sa.Table(
    "fair_shares",
    metadata,
    sa.Column("pool", sa.String(100), primary_key=True),
    sa.Column("priority", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("tenant_id", Uuid, primary_key=True),
    sa.Column("pass", sa.Float, nullable=False),
)

# The virtual time of a (pool, class): the pass of the last run given out. A tenant
# coming back from idle starts here, so it cannot claim the time it was away.
fair_clocks = sa.Table(
    "fair_clocks",
    metadata,
    sa.Column("pool", sa.String(100), primary_key=True),
    sa.Column("priority", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("vtime", sa.Float, nullable=False),
)

# Token buckets every node draws on (``dispatch:<tenant id>``, ``api:<key id>``): up
# to its burst in ``tokens`` as of ``stamp``, refilled at its rate when next read.
rate_buckets = sa.Table(
    "rate_buckets",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("stamp", UtcDateTime, nullable=False),
)

shard_leases = sa.Table(
    "shard_leases",
    metadata,
    sa.Column("shard", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("owner", sa.String(100)),
    sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("expires_at", UtcDateTime),
)

# Scheduler nodes alive: each beats here, so every node knows how many share the shards.
scheduler_nodes = sa.Table(
    "scheduler_nodes",
    metadata,
    sa.Column("node_id", sa.String(100), primary_key=True),
    sa.Column("started_at", UtcDateTime, nullable=False),
    sa.Column("heartbeat_at", UtcDateTime, nullable=False),
)

# SQLite has no sequences: one row here hands out fencing tokens inside the (serialised)
# write transaction. PostgreSQL uses FENCING_SEQUENCE instead.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.String(40), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

# Worker logs in the database (the database log store, docs/logs.md): one row per
# appended batch of an attempt's lines — its JSON lines, zlib-compressed — covering the
# bytes [start_offset, end_offset) of the attempt's log; a ``marker`` row is the line
# that ends a capped log, rewritten in place as more lines are dropped. Partitioned by
# the day of the append on PostgreSQL (partitions are made ahead by the writers and
# dropped whole by retention); one table on SQLite.
log_chunks = sa.Table(
    "log_chunks",
    metadata,
    sa.Column("tenant_id", Uuid, nullable=False),
    sa.Column("run_id", Uuid, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("day", sa.Date, nullable=False),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
    sa.Column("marker", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("data", sa.LargeBinary, nullable=False),
    # A partitioned table's keys must hold its partition key: ``day`` comes last.
    sa.PrimaryKeyConstraint("tenant_id", "run_id", "attempt", "seq", "day"),
    postgresql_partition_by="RANGE (day)",
)

# Dashboard sessions (``cronwheel/ui``), shared by every API node: a row per signed-in
# browser, found by the SHA-256 of its cookie's token (the token itself is never
# stored), with the hash of the API key it signed in with — re-checked on every request,
# so a revoked key ends its sessions. ``tenant_id``: the tenant the session looks at (the
# key's own; for the admin key, the one it chose, None until then).
ui_sessions = sa.Table(
    "ui_sessions",
    metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("tenant_id", Uuid),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("last_seen_at", UtcDateTime, nullable=False),
    # The earlier of idle expiry (last seen + the idle timeout) and the session's end of
    # life (created + its lifetime): past it the row is dead and purged.
    sa.Column("expires_at", UtcDateTime, nullable=False),
    sa.Index("ix_ui_sessions_expires_at", "expires_at"),
)
