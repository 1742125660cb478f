"""PostgreSQL's hot paths, in raw asyncpg on the transaction's own connection.

Each of these is one round trip per batch: the data-modifying CTEs move runs, write
attempts and append events in a single statement. They implement exactly the contract of
the generic versions in ``store/sql/``; the conformance suite runs both.

Parameter conventions: ``$1`` is always the caller's ``now`` (NULL means the database
clock, read once per statement with ``statement_timestamp()``); JSON goes in as text.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from cronwheel.domain.model import (
    AttemptOutcome,
    FiredRun,
    LeasedAttempt,
    ReservationsStarted,
    Worker,
)
from cronwheel.domain.states import RunState
from cronwheel.store.base import LeaseRenewal, ready_notices
from cronwheel.store.sql.progress import progress_deadline

__all__ = [
    "WorkerGone",
    "complete_many",
    "copy_events",
    "fire",
    "fire_candidates",
    "insert_planned",
    "lease",
    "renew",
    "start_many",
]


class WorkerGone(Exception):
    """The worker of a lease or start is not live (deregistered, or no such row): the
    store turns it into the domain's error, with the row read to tell which."""

    def __init__(self, worker_id: uuid.UUID) -> None:
        super().__init__(str(worker_id))
        self.worker_id = worker_id


_NOW = "WITH t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now)"

# A batch of runs to fire is found by primary key, always. Written plainly, the state
# precondition implies the predicate of the due-window index (shard, fire_at WHERE
# state = 'SCHEDULED'), and with statistics that lag a burst — thousands of runs created
# in the last minute, all due now — the planner reads that index instead: every due run
# of the node's shards, for each batch of 1,000. Wrapped in IS TRUE the precondition
# means the same and implies nothing, so only the primary key is left.
_SCHEDULED = "(runs.state = 'SCHEDULED') IS TRUE"

# The shards ``$3`` holds an unexpired lease on — of the epochs it acquired them at
# (``$5`` shards, ``$6`` epochs; NULL: any) — computed once per statement, then a filter
# on the rows found by id. This is the fence: a node whose lease lapsed matches nothing,
# even once it has won the shard back under a new epoch.
_HELD = """ARRAY(SELECT shard FROM shard_leases
             WHERE owner = $3 AND expires_at > {now}
               AND ($5::smallint[] IS NULL
                    OR (shard, epoch) IN (SELECT * FROM unnest($5::smallint[], $6::bigint[]))))"""

_FIRE = f"""
{_NOW},
fired AS (
    UPDATE runs SET state = 'DISPATCHED', dispatched_at = t.now, reserved_by = NULL,
                    reserved_attempt = NULL, reserved_token = NULL, reserved_until = NULL
    FROM t
    -- Rows are locked in the batch's order; a cancel or pause locking the same job's
    -- runs meanwhile can at worst deadlock, which PostgreSQL breaks: the batch fails,
    -- its runs are picked up again by the next poll.
    WHERE runs.id = ANY($2::uuid[])
      AND {_SCHEDULED}
      AND runs.fire_at <= t.now + make_interval(secs => $4)
      AND (runs.origin <> 'schedule' OR runs.attempt > 0)
      AND runs.shard = ANY({_HELD.format(now="(SELECT now FROM t)")})
    RETURNING runs.id, runs.tenant_id, runs.job_id, runs.pool, runs.fire_at, t.now AS now
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, from_state, to_state, actor, reason)
    SELECT tenant_id, now, 'run.transition', job_id, id, 'SCHEDULED', 'DISPATCHED', $3,
           CASE WHEN now - fire_at > interval '1 second' THEN
               'dispatched ' || round(extract(epoch FROM now - fire_at)::numeric, 1)
               || ' s after its due time (scheduler catching up)' END
    FROM fired
)
SELECT id, tenant_id, pool, fire_at, now FROM fired
"""


def _fence(epochs: Mapping[int, int] | None) -> tuple[list[int] | None, list[int] | None]:
    if epochs is None:
        return None, None
    return list(epochs), list(epochs.values())


async def fire(
    conn: Any,
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
            "SELECT pg_notify('cw_runs_ready', p) FROM unnest($1::text[]) p",
            ready_notices(((r["pool"], r["fire_at"]) for r in rows), rows[0]["now"]),
        )
    return [
        FiredRun(
            id=r["id"],
            tenant_id=r["tenant_id"],
            pool=r["pool"],
            fire_at=r["fire_at"],
            dispatched_at=r["now"],
        )
        for r in rows
    ]


_CANDIDATES = f"""
SELECT runs.id, runs.tenant_id, runs.job_id, runs.job_name, runs.shard, runs.due_at,
       runs.fire_at, runs.pool, jobs.state AS job_state, jobs.schedule::text AS schedule
FROM runs JOIN jobs ON jobs.id = runs.job_id
WHERE runs.id = ANY($2::uuid[])
  AND {_SCHEDULED}
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
    conn: Any,
    *,
    at: datetime,
    run_ids: Sequence[uuid.UUID],
    node_id: str,
    lead: float,
    epochs: Mapping[int, int] | None = None,
) -> list[Any]:
    """The generic ``_fire_candidates`` (first tries of recurring jobs' runs, locked,
    with their job's state and schedule), found by primary key."""
    rows = await conn.fetch(_CANDIDATES, at, list(run_ids), node_id, lead, *_fence(epochs))
    return [SimpleNamespace(**{**dict(r), "schedule": _schedule(r["schedule"])}) for r in rows]


# The worker, unless it deregistered, share-locked until the lease commits: a
# deregistration (an UPDATE of the row) waits for a lease already holding it, so the
# release that follows it finds what the lease took, and a lease that comes second
# re-reads the row once the deregistration commits and finds it gone. Shared, so the
# worker's own leases and starts never wait for each other.
_LIVE_WORKER = """live AS (
    SELECT id FROM workers WHERE id = {worker} AND deregistered_at IS NULL FOR SHARE
)"""

_LEASE = f"""
{_NOW},
{_LIVE_WORKER.format(worker="$6")},
-- The worker is alive: the routing check counts on it. At most one write a second,
-- however often a long-poll re-leases; skipped rather than waited for while another
-- of its leases holds the row too (two such would otherwise wait for each other).
seen AS (
    UPDATE workers SET last_seen_at = t.now FROM t
    WHERE workers.id IN (
        SELECT w.id FROM workers w, t
        WHERE w.id = (SELECT id FROM live) AND w.last_seen_at < t.now - interval '1 second'
        FOR NO KEY UPDATE OF w SKIP LOCKED)
),
picked AS (
    -- fire_at is the run's not-before: a run dispatched ahead of its instant waits in
    -- the ready queue until then, or (within $8 seconds of it) is reserved. A reserved
    -- run is out of the queue until its reservation is used, handed back or lapses.
    SELECT id FROM runs
    WHERE EXISTS (SELECT 1 FROM live)
      AND state = 'DISPATCHED' AND pool = $2
      AND fire_at <= (SELECT now FROM t) + make_interval(secs => $8)
      AND reserved_token IS NULL
      AND ($3::uuid IS NULL OR tenant_id = $3)
      AND requires <@ $4::jsonb
      AND (NOT $7::boolean OR task IS NULL)
    ORDER BY priority, fire_at
    LIMIT $5
    FOR UPDATE SKIP LOCKED
),
numbered AS (SELECT id, row_number() OVER () AS n FROM picked),
-- Due now: RUNNING with a new attempt. Due later: reserved for this worker under the
-- attempt id ($9, one per row) and token it will start with.
leased AS (
UPDATE runs r SET
    state = CASE WHEN r.fire_at <= t.now THEN 'RUNNING' ELSE 'DISPATCHED' END,
    attempt = r.attempt + (r.fire_at <= t.now)::int,
    started_at = CASE WHEN r.fire_at <= t.now THEN COALESCE(r.started_at, t.now)
                      ELSE r.started_at END,
    wait_reason = NULL,
    reserved_by = CASE WHEN r.fire_at <= t.now THEN NULL ELSE $6::uuid END,
    reserved_attempt = CASE WHEN r.fire_at <= t.now THEN NULL
                            ELSE ($9::uuid[])[numbered.n] END,
    reserved_token = CASE WHEN r.fire_at <= t.now THEN NULL
                          ELSE nextval('fencing_tokens') END,
    reserved_until = CASE WHEN r.fire_at <= t.now THEN NULL
                          ELSE r.fire_at + make_interval(secs => r.heartbeat_timeout) END
FROM numbered, t
WHERE r.id = numbered.id
RETURNING r.id, r.tenant_id, r.job_id, r.attempt, r.task, r.webhook, r.payload, r.timeout,
          r.heartbeat_timeout, r.progress_timeout, r.due_at, r.priority, r.fire_at,
          t.now AS now, r.state,
          r.reserved_attempt, r.reserved_until,
          COALESCE(r.reserved_token, nextval('fencing_tokens')) AS token
)
-- One row at least, leased or not: ``gone`` (the worker is not live) comes back in the
-- same round trip as the runs.
SELECT leased.*, NOT EXISTS (SELECT 1 FROM live) AS gone
FROM (SELECT 1) AS one LEFT JOIN leased ON TRUE
"""

_ATTEMPT_COLUMNS = (
    "id",
    "tenant_id",
    "run_id",
    "number",
    "worker_id",
    "fencing_token",
    "state",
    "lease_expires_at",
    "deadline",
    "started_at",
    "progress_deadline",
)
_EVENT_COLUMNS = (
    "tenant_id",
    "at",
    "kind",
    "job_id",
    "run_id",
    "attempt_id",
    "from_state",
    "to_state",
    "actor",
    "data",
)


async def lease(
    conn: Any,
    *,
    now: datetime | None,
    worker: Worker,
    max: int,
    new_id: Any,
    webhooks_only: bool = False,
    ahead: float = 0.0,
) -> list[LeasedAttempt]:
    rows = await conn.fetch(
        _LEASE,
        now,
        worker.pool,
        worker.tenant_id,
        json.dumps(sorted(worker.capabilities)),
        max,
        worker.id,
        webhooks_only,
        ahead,
        [new_id() for _ in range(max)] if ahead > 0 else None,
    )
    if rows[0]["gone"]:
        raise WorkerGone(worker.id)
    if rows[0]["id"] is None:  # the one row of an empty lease
        return []
    rows = sorted(rows, key=lambda r: (r["priority"], r["fire_at"]))
    leased: list[LeasedAttempt] = []
    attempt_rows: list[tuple[Any, ...]] = []
    event_rows: list[tuple[Any, ...]] = []
    actor = f"worker:{worker.id}"
    for r in rows:
        at: datetime = r["now"]
        if r["state"] == "DISPATCHED":  # reserved: starts at its instant, when confirmed
            leased.append(
                LeasedAttempt(
                    attempt_id=r["reserved_attempt"],
                    run_id=r["id"],
                    tenant_id=r["tenant_id"],
                    job_id=r["job_id"],
                    number=r["attempt"] + 1,
                    task=r["task"],
                    webhook=r["webhook"],
                    payload=r["payload"],
                    fencing_token=r["token"],
                    lease_expires_at=r["reserved_until"],
                    deadline=r["fire_at"] + timedelta(seconds=r["timeout"]),
                    due_at=r["due_at"],
                    heartbeat_timeout=r["heartbeat_timeout"],
                    not_before=r["fire_at"],
                    progress_timeout=r["progress_timeout"],
                )
            )
            continue
        attempt_id = new_id()
        lease_until = at + timedelta(seconds=r["heartbeat_timeout"])
        deadline = at + timedelta(seconds=r["timeout"])
        attempt_rows.append(
            (
                attempt_id,
                r["tenant_id"],
                r["id"],
                r["attempt"],
                worker.id,
                r["token"],
                "RUNNING",
                lease_until,
                deadline,
                at,
                progress_deadline(at, r["progress_timeout"]),
            )
        )
        event_rows.append(
            (
                r["tenant_id"],
                at,
                "run.transition",
                r["job_id"],
                r["id"],
                attempt_id,
                "DISPATCHED",
                "RUNNING",
                actor,
                json.dumps({"attempt": r["attempt"], "fencing_token": r["token"]}),
            )
        )
        leased.append(
            LeasedAttempt(
                attempt_id=attempt_id,
                run_id=r["id"],
                tenant_id=r["tenant_id"],
                job_id=r["job_id"],
                number=r["attempt"],
                task=r["task"],
                webhook=r["webhook"],
                payload=r["payload"],
                fencing_token=r["token"],
                lease_expires_at=lease_until,
                deadline=deadline,
                due_at=r["due_at"],
                heartbeat_timeout=r["heartbeat_timeout"],
                progress_timeout=r["progress_timeout"],
            )
        )
    if attempt_rows:
        await conn.copy_records_to_table("attempts", records=attempt_rows, columns=_ATTEMPT_COLUMNS)
        await conn.copy_records_to_table("events", records=event_rows, columns=_EVENT_COLUMNS)
    return leased


_START = f"""
{_NOW},
{_LIVE_WORKER.format(worker="$3")},
-- The reservations named, found through the reservation index by token, always: with
-- statistics that lag a burst the planner would rather read every ready run (IS TRUE
-- keeps the state condition from pointing it at the ready-queue index).
picked AS MATERIALIZED (
    SELECT id, reserved_attempt, reserved_token, fire_at FROM runs
    WHERE EXISTS (SELECT 1 FROM live)
      AND reserved_token = ANY($2::bigint[]) AND reserved_token IS NOT NULL
      AND (state = 'DISPATCHED') IS TRUE AND reserved_by = $3
      AND ($4::uuid IS NULL OR tenant_id = $4)
),
-- Each by primary key: still DISPATCHED under this reservation, and due. A cancel or
-- pause that got the row first fails these conditions, re-checked on its new version.
-- (IS TRUE: the conditions must not lead the planner to another index.)
started AS (
    UPDATE runs r SET state = 'RUNNING', attempt = r.attempt + 1,
                      started_at = COALESCE(r.started_at, t.now), wait_reason = NULL,
                      reserved_by = NULL, reserved_attempt = NULL, reserved_token = NULL,
                      reserved_until = NULL
    FROM t, picked p
    WHERE r.id = p.id AND p.fire_at <= t.now
      AND (r.state = 'DISPATCHED' AND r.reserved_token = p.reserved_token
           AND r.fire_at <= t.now) IS TRUE
    RETURNING r.id, r.tenant_id, r.job_id, r.attempt, r.due_at, r.heartbeat_timeout, r.timeout,
              r.progress_timeout, p.reserved_attempt AS attempt_id, p.reserved_token AS token,
              t.now AS now
),
att AS (
    INSERT INTO attempts (id, tenant_id, run_id, number, worker_id, fencing_token, state,
                          lease_expires_at, deadline, started_at, progress_deadline)
    SELECT attempt_id, tenant_id, id, attempt, $3, token, 'RUNNING',
           now + make_interval(secs => heartbeat_timeout), now + make_interval(secs => timeout),
           now, now + make_interval(secs => progress_timeout)
    FROM started
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state, to_state,
                        actor, data)
    SELECT tenant_id, now, 'run.transition', job_id, id, attempt_id, 'DISPATCHED', 'RUNNING',
           'worker:' || $3::text, jsonb_build_object('attempt', attempt, 'fencing_token', token)
    FROM started
)
SELECT token, now, CASE WHEN attempt = 1 THEN due_at END AS first_due, FALSE AS gone
FROM started
UNION ALL
SELECT reserved_token, NULL, NULL, FALSE FROM picked, t WHERE picked.fire_at > t.now
UNION ALL
SELECT NULL, NULL, NULL, TRUE WHERE NOT EXISTS (SELECT 1 FROM live)
"""


async def start_many(
    conn: Any,
    *,
    now: datetime | None,
    worker_id: uuid.UUID,
    tokens: Sequence[int],
    tenant_id: uuid.UUID | None,
) -> ReservationsStarted:
    rows = await conn.fetch(_START, now, list(tokens), worker_id, tenant_id)
    if any(r["gone"] for r in rows):
        raise WorkerGone(worker_id)
    started = [r for r in rows if r["now"] is not None]
    done = {r["token"] for r in rows}
    return ReservationsStarted(
        started_at=started[0]["now"] if started else None,
        started=[r["token"] for r in started],
        not_yet=[r["token"] for r in rows if r["now"] is None],
        refused=[t for t in tokens if t not in done],
        first_tries_due=[r["first_due"] for r in started if r["first_due"] is not None],
    )


_COMPLETE = f"""
{_NOW},
done AS (
    UPDATE attempts a SET state = 'SUCCEEDED', finished_at = t.now, result = v.result
    FROM t, unnest($2::uuid[], $3::bigint[], $4::jsonb[]) AS v(id, token, result)
    WHERE a.id = v.id AND a.fencing_token = v.token AND a.state = 'RUNNING'
      AND ($5::uuid IS NULL OR a.tenant_id = $5)
    RETURNING a.id, a.fencing_token, a.run_id, v.result, t.now AS now
),
finished AS (
    UPDATE runs SET state = CASE WHEN runs.cancel_requested THEN 'CANCELLED' ELSE 'SUCCESS' END,
                    finished_at = done.now, result = done.result, reason = NULL
    FROM done
    WHERE runs.id = done.run_id AND runs.state = 'RUNNING'
    RETURNING runs.id, runs.tenant_id, runs.job_id, runs.state, done.id AS attempt_id, done.now
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state, to_state,
                        reason)
    SELECT tenant_id, now, 'run.transition', job_id, id, attempt_id, 'RUNNING', state,
           CASE WHEN state = 'CANCELLED' THEN 'cancelled while running' END
    FROM finished
),
jobs_done AS (
    UPDATE jobs SET state = 'finished', next_due_at = NULL, updated_at = t.now
    FROM t
    WHERE jobs.id IN (SELECT job_id FROM finished) AND jobs.state = 'active'
      AND jobs.kind IN ('at', 'delay', 'asap')
)
SELECT done.id, done.fencing_token, finished.state
FROM done LEFT JOIN finished ON finished.attempt_id = done.id
"""


async def complete_many(
    conn: Any,
    *,
    now: datetime | None,
    ids: Sequence[uuid.UUID],
    tokens: Sequence[int],
    results: Sequence[Any],
    tenant_id: uuid.UUID | None,
) -> dict[tuple[uuid.UUID, int], AttemptOutcome]:
    encoded = [None if r is None else json.dumps(r) for r in results]
    rows = await conn.fetch(_COMPLETE, now, list(ids), list(tokens), encoded, tenant_id)
    return {
        (r["id"], r["fencing_token"]): AttemptOutcome(
            r["id"], True, run_state=RunState(r["state"]) if r["state"] else None
        )
        for r in rows
    }


_PLANNED = """
WITH v AS (
    SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[],
                         $7::text[], $8::text[])
        AS v(source, id, due_at, due_local, state, origin, reason)
),
ins AS (
    INSERT INTO runs (id, tenant_id, job_id, job_name, origin, shard, state, due_at, due_local,
                      fire_at, priority, pool, requires, tags, task, webhook, payload, attempt,
                      max_attempts, retry, timeout, heartbeat_timeout, progress_timeout, reason,
                      created_at, dispatched_at, finished_at)
    SELECT v.id, r.tenant_id, r.job_id, r.job_name, v.origin, r.shard, v.state, v.due_at,
           v.due_local, v.due_at, (j.template->>'priority')::smallint, j.template->>'pool',
           j.template->'requires', j.template->'tags', j.template->>'task',
           NULLIF(j.template->'webhook', 'null'::jsonb), j.template->'payload', 0,
           (j.template->'retry'->>'max_attempts')::int, j.template->'retry',
           (j.template->>'timeout')::float8, (j.template->>'heartbeat_timeout')::float8,
           (j.template->>'progress_timeout')::float8, v.reason, $1,
           CASE WHEN v.state = 'DISPATCHED' THEN $1::timestamptz END,
           CASE WHEN v.state = 'SKIPPED' THEN $1::timestamptz END
    FROM v JOIN runs r ON r.id = v.source JOIN jobs j ON j.id = r.job_id
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
"""


async def insert_planned(
    conn: Any, *, at: datetime, planned: Sequence[Any], node_id: str
) -> list[Any]:
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
    return [SimpleNamespace(**dict(r)) for r in rows]


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


async def copy_events(conn: Any, rows: Sequence[dict[str, Any]]) -> None:
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
    conn: Any, *, node_id: str, ttl: float, shards: int, now: datetime | None
) -> LeaseRenewal:
    """``Store.scheduler_renew`` in one statement (the lease rows must exist)."""
    row = await conn.fetchrow(_RENEW, now, node_id, ttl, shards)
    return LeaseRenewal(
        live=int(row["live"]),
        share=int(row["share"]),
        held=dict(zip(row["shards"], row["epochs"], strict=True)),
        others_expire_at=row["others"],
    )
