"""The PostgreSQL driver's statements for the scheduler — fire a batch, create the
next occurrences, append events, renew shard leases — in raw asyncpg on the
transaction's own connection (the worker side is in ``postgres_leasing.py``).

Each is one round trip per batch: data-modifying CTEs move runs, write attempts and
append events in a single statement (COPY where rows need no answer). They implement the
contract of ``store/driver.py``; the driver conformance suite runs them and the SQLite
driver's against the same tests.

Parameter conventions: ``$1`` is always the caller's ``now`` (NULL means the database
clock, read once per statement with ``statement_timestamp()``); JSON goes in as text.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cronwheel.domain.model import FiredRun
from cronwheel.domain.states import FIRE
from cronwheel.store.driver import CreatedRun, FireCandidate, PlannedRun
from cronwheel.store.notices import CHANNEL_RUNS_READY, ready_notices
from cronwheel.store.values import LeaseRenewal

__all__ = [
    "NOW",
    "Raw",
    "copy_events",
    "fire",
    "fire_candidates",
    "insert_planned",
    "renew",
    "spread_instant_sql",
]

# An asyncpg connection (the library has no type hints).
Raw = Any

NOW = "WITH t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now)"

# A batch of runs to fire is found by primary key, always. Written plainly, the state
# precondition implies the predicate of the due-window index (shard, fire_at WHERE
# state = 'SCHEDULED'), and with statistics that lag a burst — thousands of runs created
# in the last minute, all due now — the planner reads that index instead: every due run
# of the node's shards, for each batch of 1,000. Wrapped in IS TRUE the precondition
# means the same and implies nothing, so only the primary key is left.
# (The fire and skip moves leave the same states.)
_FIRABLE = f"({FIRE.sql('runs.state')}) IS TRUE"

# The shards ``$3`` holds an unexpired lease on — of the epochs it acquired them at
# (``$5`` shards, ``$6`` epochs; NULL: any) — computed once per statement, then a filter
# on the rows found by id. This is the fence: a node whose lease lapsed matches nothing,
# even once it has won the shard back under a new epoch.
_HELD = """ARRAY(SELECT shard FROM shard_leases
             WHERE owner = $3 AND expires_at > {now}
               AND ($5::smallint[] IS NULL
                    OR (shard, epoch) IN (SELECT * FROM unnest($5::smallint[], $6::bigint[]))))"""

_FIRE = f"""
{NOW},
fired AS (
    UPDATE runs SET state = 'DISPATCHED', dispatched_at = t.now, reserved_by = NULL,
                    reserved_attempt = NULL, reserved_token = NULL, reserved_until = NULL
    FROM t
    -- Rows are locked in the batch's order; a cancel or pause locking the same job's
    -- runs meanwhile can at worst deadlock, which PostgreSQL breaks: the batch fails,
    -- its runs are picked up again by the next poll.
    WHERE runs.id = ANY($2::uuid[])
      AND {_FIRABLE}
      AND runs.fire_at <= t.now + make_interval(secs => $4)
      AND (runs.origin <> 'schedule' OR runs.attempt > 0)
      AND runs.shard = ANY({_HELD.format(now="(SELECT now FROM t)")})
    RETURNING runs.id, runs.tenant_id, runs.job_id, runs.pool, runs.fire_at, runs.priority,
              t.now AS now
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, from_state, to_state, actor, reason)
    SELECT tenant_id, now, 'run.transition', job_id, id, '{FIRE.source}', 'DISPATCHED', $3,
           CASE WHEN now - fire_at > interval '1 second' THEN
               'dispatched ' || round(extract(epoch FROM now - fire_at)::numeric, 1)
               || ' s after its due time (scheduler catching up)' END
    FROM fired
)
SELECT id, tenant_id, pool, fire_at, priority, now FROM fired
"""


def _fence(epochs: Mapping[int, int] | None) -> tuple[list[int] | None, list[int] | None]:
    if epochs is None:
        return None, None
    return list(epochs), list(epochs.values())


async def fire(
    conn: Raw,
    *,
    now: datetime | None,
    run_ids: Sequence[uuid.UUID],
    node_id: str,
    lead: float,
    epochs: Mapping[int, int] | None = None,
) -> list[FiredRun]:
    rows = await conn.fetch(_FIRE, now, list(run_ids), node_id, lead, *_fence(epochs))
    if rows:
        await conn.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) p",
            CHANNEL_RUNS_READY,
            ready_notices(((r["pool"], r["fire_at"]) for r in rows), rows[0]["now"]),
        )
    return [
        FiredRun(
            id=r["id"],
            tenant_id=r["tenant_id"],
            pool=r["pool"],
            fire_at=r["fire_at"],
            dispatched_at=r["now"],
            priority=r["priority"],
        )
        for r in rows
    ]


_CANDIDATES = f"""
SELECT runs.id, runs.tenant_id, runs.job_id, runs.job_name, runs.shard, runs.due_at,
       runs.fire_at, runs.pool, runs.priority, jobs.state AS job_state,
       jobs.schedule::text AS schedule, COALESCE((jobs.template->>'spread')::float8, 0) AS spread
FROM runs JOIN jobs ON jobs.id = runs.job_id
WHERE runs.id = ANY($2::uuid[])
  AND {_FIRABLE}
  AND runs.origin = 'schedule' AND runs.attempt = 0
  AND runs.fire_at <= $1::timestamptz + make_interval(secs => $4)
  AND runs.shard = ANY({_HELD.format(now="$1::timestamptz")})
FOR UPDATE OF runs SKIP LOCKED
"""


@functools.lru_cache(maxsize=4096)
def _schedule(text: str) -> dict[str, Any]:
    """Jobs firing together share a handful of schedules: decode each once. Callers
    only read the result."""
    decoded: dict[str, Any] = json.loads(text)
    return decoded


async def fire_candidates(
    conn: Raw,
    *,
    at: datetime,
    run_ids: Sequence[uuid.UUID],
    node_id: str,
    lead: float,
    epochs: Mapping[int, int] | None = None,
) -> list[FireCandidate]:
    """``Driver.runs_fire_candidates``, found by primary key."""
    rows = await conn.fetch(_CANDIDATES, at, list(run_ids), node_id, lead, *_fence(epochs))
    return [FireCandidate(**{**dict(r), "schedule": _schedule(r["schedule"])}) for r in rows]


def spread_instant_sql(job_id: str, due_at: str, spread: str) -> str:
    """SQL for ``timing.spread.spread_instant(job_id, due_at, spread)``: the same md5 of
    the job id and the due instant's epoch microseconds, the same integer arithmetic
    (numeric: 2**32 times a day's microseconds overflows a bigint)."""
    return f"""({due_at} + CASE WHEN {spread} > 0 THEN interval '1 microsecond' * div(
        ('x' || substr(md5({job_id}::text || ':'
                           || (extract(epoch FROM {due_at}) * 1000000)::bigint::text), 1, 8)
        )::bit(32)::bigint::numeric * round({spread} * 1000000), 4294967296)::float8
        ELSE interval '0' END)"""


# The worker, unless it deregistered, share-locked until the lease commits: a
# deregistration (an UPDATE of the row) waits for a lease already holding it, so the
# release that follows it finds what the lease took, and a lease that comes second
# re-reads the row once the deregistration commits and finds it gone. Shared, so the
# worker's own leases and starts never wait for each other.
_PLANNED = """
WITH v AS (
    SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[],
                         $7::text[], $8::text[])
        AS v(source, id, due_at, due_local, state, origin, reason)
),
ins AS (
    INSERT INTO runs (id, tenant_id, job_id, job_name, origin, shard, state, due_at, due_local,
                      fire_at, priority, pool, requires, tags, route_tags, task, webhook,
                      payload, attempt, max_attempts, retry, timeout, heartbeat_timeout,
                      progress_timeout, reason, created_at, dispatched_at, finished_at,
                      overrides)
    SELECT v.id, r.tenant_id, r.job_id, r.job_name, v.origin, r.shard, v.state, v.due_at,
           v.due_local, {SPREAD_AT}, (o.f->>'priority')::smallint, o.f->>'pool',
           j.template->'requires', j.template->'tags',
           COALESCE(j.template->'route_tags', '[]'::jsonb), j.template->>'task',
           NULLIF(j.template->'webhook', 'null'::jsonb), o.f->'payload', 0,
           (j.template->'retry'->>'max_attempts')::int, j.template->'retry',
           (o.f->>'timeout')::float8, (j.template->>'heartbeat_timeout')::float8,
           (j.template->>'progress_timeout')::float8, v.reason, $1,
           CASE WHEN v.state = 'DISPATCHED' THEN $1::timestamptz END,
           CASE WHEN v.state = 'SKIPPED' THEN $1::timestamptz END,
           j.overrides - 'fields'
    FROM v JOIN runs r ON r.id = v.source JOIN jobs j ON j.id = r.job_id,
         -- the fields an override may set: the job's future overrides' (overlay.py)
         LATERAL (SELECT COALESCE(j.overrides->'fields', j.template) AS f) o
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id, job_id, state, reason, shard, fire_at, pool
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, from_state, to_state, actor, reason)
    SELECT tenant_id, $1, 'run.transition', job_id, id, from_state, to_state, $9, why
    FROM (
        SELECT tenant_id, job_id, id, NULL AS from_state, 'SCHEDULED' AS to_state,
               'next occurrence' AS why, 0 AS step
        FROM ins
        UNION ALL
        SELECT tenant_id, job_id, id, 'SCHEDULED', state, reason, 1
        FROM ins WHERE state <> 'SCHEDULED'
    ) e
    ORDER BY step, id
)
SELECT id, tenant_id, job_id, state, reason, shard, fire_at, pool FROM ins
""".replace(
    "{SPREAD_AT}",
    spread_instant_sql("j.id", "v.due_at", "COALESCE((j.template->>'spread')::numeric, 0)"),
)


async def insert_planned(
    conn: Raw, *, at: datetime, planned: Sequence[PlannedRun], node_id: str
) -> list[CreatedRun]:
    """Create planned runs of recurring jobs (templates read from their jobs) and their
    events, skipping occurrences that already have a run: one statement."""
    if not planned:
        return []
    rows = await conn.fetch(
        _PLANNED,
        at,
        [p.source for p in planned],
        [p.id for p in planned],
        [p.due_at for p in planned],
        [p.due_local for p in planned],
        [p.state for p in planned],
        [p.origin for p in planned],
        [p.reason for p in planned],
        node_id,
    )
    return [CreatedRun(**dict(r)) for r in rows]


_EVENT_COLUMNS_ALL = (
    "tenant_id",
    "at",
    "kind",
    "job_id",
    "run_id",
    "attempt_id",
    "from_state",
    "to_state",
    "actor",
    "reason",
    "data",
)


async def copy_events(conn: Raw, rows: Sequence[dict[str, Any]]) -> None:
    """Append events with COPY: the fastest way in, and events need no ids back."""
    await conn.copy_records_to_table(
        "events",
        records=[
            (
                r["tenant_id"],
                r["at"],
                r["kind"],
                r["job_id"],
                r["run_id"],
                r["attempt_id"],
                r["from_state"],
                r["to_state"],
                r["actor"],
                r["reason"],
                None if r["data"] is None else json.dumps(r["data"]),
            )
            for r in rows
        ],
        columns=_EVENT_COLUMNS_ALL,
    )


_RENEW = """
WITH t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now,
                  make_interval(secs => $3) AS ttl),
gone AS (
    DELETE FROM scheduler_nodes
    WHERE node_id <> $2 AND heartbeat_at < (SELECT now - ttl FROM t)
),
me AS (
    INSERT INTO scheduler_nodes (node_id, started_at, heartbeat_at)
    SELECT $2, now, now FROM t
    ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
),
live AS (
    SELECT 1 + count(*) AS n FROM scheduler_nodes, t
    WHERE node_id <> $2 AND heartbeat_at >= t.now - t.ttl
),
share AS (SELECT ((($4)::int + n - 1) / n)::int AS k FROM live),
-- Our own unexpired leases: renewed, the epoch stays.
renewed AS (
    UPDATE shard_leases SET expires_at = t.now + t.ttl FROM t
    WHERE owner = $2 AND expires_at > t.now AND shard < $4
    RETURNING shard, epoch
),
-- Up to the share: expired leases first (their owner died or stalled: failover comes
-- first), then free ones (never owned, or handed back). Taking no more than the share
-- leaves a dead node's other shards to the other survivors, which wake at the same
-- moment, instead of taking them and handing them back a renewal later. SKIP LOCKED:
-- nodes taking at once never wait. A change of owner bumps the epoch.
grab AS (
    SELECT shard FROM shard_leases, t
    WHERE shard < $4 AND (owner IS NULL OR expires_at <= t.now)
    ORDER BY owner IS NULL, shard
    LIMIT GREATEST(0, (SELECT k FROM share) - (SELECT count(*) FROM renewed))
    FOR UPDATE OF shard_leases SKIP LOCKED
),
grabbed AS (
    UPDATE shard_leases l SET owner = $2, expires_at = t.now + t.ttl, epoch = l.epoch + 1
    FROM grab, t
    WHERE l.shard = grab.shard
    RETURNING l.shard, l.epoch
),
held AS (
    SELECT shard, epoch FROM renewed
    UNION ALL SELECT shard, epoch FROM grabbed
)
SELECT (SELECT n FROM live) AS live, (SELECT k FROM share) AS share,
       (SELECT min(expires_at) FROM shard_leases, t
        WHERE owner IS NOT NULL AND owner <> $2 AND expires_at > t.now) AS others,
       ARRAY(SELECT shard FROM held) AS shards, ARRAY(SELECT epoch FROM held) AS epochs
"""


async def renew(
    conn: Raw, *, node_id: str, ttl: float, shards: int, now: datetime | None
) -> LeaseRenewal:
    """``Store.scheduler_renew`` in one statement (the lease rows must exist)."""
    row = await conn.fetchrow(_RENEW, now, node_id, ttl, shards)
    return LeaseRenewal(
        live=int(row["live"]),
        share=int(row["share"]),
        held=dict(zip(row["shards"], row["epochs"], strict=True)),
        others_expire_at=row["others"],
    )


# $1 is the caller's now (NULL: the database clock); one row of $2… per (attempt, token).
# A beat without a report leaves the progress columns as they are; a report under no
# progress timeout leaves the deadline NULL (now plus a NULL interval).
