"""A tenant's volume made in bulk: jobs, runs in every state, their attempts and events,
cloned in a few ``INSERT … SELECT generate_series`` statements from one job and run the
store itself wrote (so every row reads back as the store's own).

The runs are spread as a deployment's are after a while: most finished, a ready
backlog in the shared pool (some of it waiting for want of a worker), some scheduled
ahead, a few running, dead letters (some quarantined). Per 100 runs, by ``i % 100``:

    0-79 SUCCESS   80-84 FAILED   85-89 SCHEDULED   90-97 DISPATCHED
    98   DEAD_LETTER (1 in 10 quarantined)          99    RUNNING

One in ten DISPATCHED runs carries a ``wait_reason``. Every run but a SCHEDULED one has
one attempt; every run has one event (its creation) and a started one a second (its
last transition). Instants are around ``T0``: SCHEDULED runs are due after it, the
others at or before it; ids are time-ordered like the store's (UUID version 7).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

__all__ = ["Volume", "add_volume", "bulk_load", "two_tenants"]


@dataclass(frozen=True, slots=True)
class Volume:
    tenant_id: uuid.UUID
    runs: int
    jobs: int


def _uuid7(ts: str, salt: str, n: str) -> str:
    """A version 7 UUID for the instant ``ts``: its milliseconds, then ``salt`` (three
    hex digits, one per statement and tenant) and ``n`` (15 hex digits, unique within
    the statement) — cheaper than random bits, and as unique."""
    return (
        f"(lpad(to_hex((extract(epoch FROM {ts}) * 1000)::bigint), 12, '0') || '7'"
        f" || {salt} || '8' || {n})::uuid"
    )


def _hex15(n: str) -> str:
    return f"lpad(to_hex({n}), 15, '0')"


_JOBS = f"""
INSERT INTO jobs (id, tenant_id, name, state, kind, schedule, template, tags, version,
                  created_at, updated_at)
SELECT {_uuid7("j.created_at - make_interval(secs => g)", "$3", _hex15("g"))},
       j.tenant_id, j.name || '-' || g, j.state, j.kind, j.schedule, j.template, j.tags, 1,
       j.created_at, j.updated_at
FROM jobs j, generate_series(2, $2::int) AS g
WHERE j.id = $1
"""

_RUNS = f"""
WITH js AS MATERIALIZED (
    SELECT id, (row_number() OVER (ORDER BY id) - 1)::int AS k FROM jobs WHERE tenant_id = $2
),
g AS (
    SELECT i, i % 100 AS b, (i / 100) % 10 AS tenth,
           i % (SELECT count(*) FROM js)::int AS k,
           $4::timestamptz - make_interval(secs => 2 * ($3::int - i + 1) + 60) AS created,
           CASE WHEN i % 100 BETWEEN 85 AND 89 THEN $4::timestamptz + make_interval(secs => i)
                ELSE $4::timestamptz - make_interval(secs => 2 * ($3::int - i + 1)) END AS due
    FROM generate_series(1, $3::int) AS i
),
s AS (
    SELECT g.*, CASE WHEN b < 80 THEN 'SUCCESS' WHEN b < 85 THEN 'FAILED'
                     WHEN b < 90 THEN 'SCHEDULED' WHEN b < 98 THEN 'DISPATCHED'
                     WHEN b = 98 THEN 'DEAD_LETTER' ELSE 'RUNNING' END AS state
    FROM g
)
INSERT INTO runs (id, tenant_id, job_id, job_name, origin, shard, state, due_at, fire_at,
                  priority, pool, requires, tags, route_tags, task, payload, attempt,
                  max_attempts, retry, timeout, heartbeat_timeout, reason, wait_reason,
                  quarantined_at, created_at, dispatched_at, started_at, finished_at)
SELECT {_uuid7("s.created", "$5", _hex15("s.i"))}, r.tenant_id, js.id, r.job_name, 'schedule',
       (hashtext(js.id::text) & 255), s.state, s.due, s.due,
       r.priority, r.pool, r.requires, r.tags, r.route_tags, r.task, r.payload,
       CASE WHEN s.state IN ('SCHEDULED', 'DISPATCHED') THEN 0 ELSE 1 END,
       r.max_attempts, r.retry, r.timeout, r.heartbeat_timeout,
       CASE WHEN s.state IN ('FAILED', 'DEAD_LETTER') THEN 'boom' END,
       CASE WHEN s.state = 'DISPATCHED' AND s.tenth = 0
            THEN 'no live worker in pool ''' || r.pool || ''' handles task ''x''' END,
       CASE WHEN s.state = 'DEAD_LETTER' AND s.tenth = 0 THEN s.due END,
       s.created,
       CASE WHEN s.state <> 'SCHEDULED' THEN s.due END,
       CASE WHEN s.state NOT IN ('SCHEDULED', 'DISPATCHED') THEN s.due END,
       CASE WHEN s.state IN ('SUCCESS', 'FAILED', 'DEAD_LETTER')
            THEN s.due + interval '1 second' END
FROM s JOIN js ON js.k = s.k, runs r
WHERE r.id = $1
"""

# An attempt's id ends as its run's does: unique as theirs are.
_RUN_BITS = "right(replace(r.id::text, '-', ''), 15)"

_ATTEMPTS = f"""
INSERT INTO attempts (id, tenant_id, run_id, number, worker_id, fencing_token, state,
                      lease_expires_at, deadline, started_at, heartbeat_at, finished_at, error)
SELECT {_uuid7("r.started_at", "$5", _RUN_BITS)}, r.tenant_id, r.id, 1, $2,
       $6::bigint + row_number() OVER (),
       CASE r.state WHEN 'SUCCESS' THEN 'SUCCEEDED' WHEN 'RUNNING' THEN 'RUNNING'
                    ELSE 'FAILED' END,
       CASE WHEN r.state = 'RUNNING' THEN $3::timestamptz + interval '1 hour'
            ELSE r.started_at + interval '30 seconds' END,
       r.started_at + interval '1 hour', r.started_at, r.started_at, r.finished_at, r.reason
FROM runs r
WHERE r.tenant_id = $1 AND r.started_at IS NOT NULL AND r.id <> $4
"""

_EVENTS = """
INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state, to_state,
                    actor)
SELECT r.tenant_id, e.at, 'run.transition', r.job_id, r.id, NULL, e.from_state, e.to_state,
       e.actor
FROM runs r
CROSS JOIN LATERAL (
    VALUES (r.created_at, NULL, 'SCHEDULED', 'scheduler'),
           (r.finished_at, 'RUNNING', r.state, 'worker')
) AS e(at, from_state, to_state, actor)
WHERE r.tenant_id = $1 AND r.id <> $2 AND e.at IS NOT NULL
ORDER BY e.at
"""


_SECONDARY_INDEXES = """
SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS definition
FROM pg_index i
WHERE i.indrelid = ANY(SELECT oid FROM pg_class WHERE relname = ANY($1::text[]))
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
"""


@contextlib.asynccontextmanager
async def bulk_load(conn: asyncpg.Connection, tables: Sequence[str]) -> AsyncIterator[None]:
    """Within: the tables' indexes other than their keys are gone, and foreign keys go
    unchecked (the rows are clones of valid ones); on leaving, the indexes are rebuilt
    as they were. A load is several times faster so."""
    found = await conn.fetch(_SECONDARY_INDEXES, list(tables))
    await conn.execute("SET synchronous_commit = off")
    await conn.execute("SET session_replication_role = replica")
    for row in found:
        await conn.execute(f"DROP INDEX {row['name']}")
    yield
    await conn.execute("RESET session_replication_role")
    await conn.execute("SET maintenance_work_mem = '256MB'")
    for row in found:
        await conn.execute(row["definition"])


_salts = itertools.count(0x100)


async def add_volume(
    conn: asyncpg.Connection,
    *,
    tenant_id: uuid.UUID,
    model_job: uuid.UUID,
    model_run: uuid.UUID,
    worker_id: uuid.UUID,
    runs: int,
    jobs: int,
    t0: datetime,
) -> Volume:
    """Give ``tenant_id`` ``jobs`` jobs (clones of ``model_job``, its own included) and
    ``runs`` more runs (clones of ``model_run``) spread over them, with their attempts
    (of ``worker_id``) and events."""
    await conn.execute(_JOBS, model_job, jobs, f"{next(_salts):03x}")
    await conn.execute(_RUNS, model_run, tenant_id, runs, t0, f"{next(_salts):03x}")
    # Fencing tokens from the sequence's next, which then moves past them.
    first = await conn.fetchval("SELECT nextval('fencing_tokens')")
    done = await conn.execute(
        _ATTEMPTS, tenant_id, worker_id, t0, model_run, f"{next(_salts):03x}", first
    )
    await conn.execute("SELECT setval('fencing_tokens', $1)", first + int(done.split()[-1]) + 1)
    await conn.execute(_EVENTS, tenant_id, model_run)
    return Volume(tenant_id=tenant_id, runs=runs, jobs=jobs)


async def two_tenants(url: str, runs: int) -> tuple[uuid.UUID, uuid.UUID]:
    """A fresh database at ``url`` (PostgreSQL) migrated and filled: a tenant with
    ``runs`` runs over 10,000 jobs beside one with 100 over 5, each with a worker,
    vacuumed. Answers the two tenants' ids, the big one first. (The benches' world.)"""
    from cronwheel.store import create_store
    from pg_server import pg_connect
    from store.helpers import T0, create_job, make_tenant, register_worker

    store = create_store(url, pool_size=1, pool_overflow=0)
    await store.migrate()
    await store.open()
    made = []
    try:
        for name in ("big", "small"):
            tenant = await make_tenant(store, name)
            job, run = await create_job(store, tenant.id, schedule={"cron": "* * * * *"})
            worker = await register_worker(store, tenant.id)
            made.append((tenant.id, job.id, run.id, worker.id))
    finally:
        await store.close()
    conn = await pg_connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        async with bulk_load(conn, ("runs", "attempts", "events", "jobs")):
            for (tenant_id, job_id, run_id, worker_id), n, jobs in zip(
                made, (runs, 100), (10_000, 5), strict=True
            ):
                await add_volume(
                    conn,
                    tenant_id=tenant_id,
                    model_job=job_id,
                    model_run=run_id,
                    worker_id=worker_id,
                    runs=n,
                    jobs=jobs,
                    t0=T0,
                )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return made[0][0], made[1][0]
