"""The PostgreSQL driver's statements for workers — lease, start, heartbeat and
complete a batch — in raw asyncpg on the transaction's own connection (the scheduler's
side, and the conventions both follow, are in ``postgres_firing.py``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from cronwheel.domain.model import (
    AttemptOutcome,
    LeasedAttempt,
    ReservationsStarted,
    Worker,
)
from cronwheel.domain.states import FINISH, START, RunState
from cronwheel.domain.workflow import UPSTREAM_DONE
from cronwheel.store.driver import Outcomes, WorkerGone
from cronwheel.store.drivers.postgres_firing import NOW, Raw
from cronwheel.store.schema import GATED, READY
from cronwheel.store.sql.progress import last_reports
from cronwheel.store.values import GateOpened, Grant, HeartbeatItem, ReadyQueue

__all__ = [
    "complete_many",
    "heartbeat_many",
    "lease",
    "ready_queue",
    "start_many",
]

_LIVE_WORKER = """live AS (
    SELECT id FROM workers WHERE id = {worker} AND deregistered_at IS NULL FOR SHARE
)"""

# What a worker can take of its pool's ready queue (the same conditions in the
# statement that reads the queue and the one that leases from it). fire_at is the
# run's not-before: a run dispatched ahead of its instant waits in the ready queue
# until then, or (within ``ahead`` seconds of it) is reserved; ``later``: only runs not
# due yet are taken (reservations beyond the worker's slots). A reserved run is out of
# the queue until its reservation is used, handed back or lapses. What the worker can
# run (``tasks``: its tasks as the keys of a JSON object, NULL for any; ``tags``: its
# tags, which must hold the run's route tags) filters the queue as the index walks it:
# runs it cannot take are stepped over, never counted, never locked. The task is looked
# up as a key (a binary search, however many tasks), and not with = ANY: statistics
# saying the worker's tasks are rare would have the planner read and sort the whole
# queue even when the worker's runs lead it, where walking the index stops at the batch.
_FITS = """r.pool = {pool}
      AND r.requires <@ {caps}::jsonb
      AND r.route_tags <@ {tags}::jsonb
      AND (NOT {webhooks_only}::boolean OR r.task IS NULL)
      AND ({tasks}::jsonb IS NULL OR r.task IS NULL OR {tasks}::jsonb -> r.task IS NOT NULL)"""
_TAKEABLE = (
    """{START} AND r.reserved_token IS NULL
      AND r.fire_at <= (SELECT now FROM t) + make_interval(secs => {ahead})
      AND (NOT {later}::boolean OR r.fire_at > (SELECT now FROM t))
      AND """
    + _FITS
)
# A gated lease takes, instead, workflow nodes waiting for upstream nodes that are all
# under way (``ix_runs_gated``): reserved ahead of their gate, whatever their fire_at.
_GATED_TAKEABLE = f"{GATED}\n      AND " + _FITS

_TAKEABLE_READ = _TAKEABLE.format(
    START=START.sql("r.state"),
    pool="$2",
    ahead="$7",
    later="$10",
    caps="$4",
    tags="$9",
    webhooks_only="$6",
    tasks="$8",
)
_TAKEABLE_LEASE = _TAKEABLE.format(
    START=START.sql("r.state"),
    pool="$2",
    ahead="$7",
    later="$14",
    caps="$4",
    tags="$10",
    webhooks_only="$6",
    tasks="$9",
)

# The tenants waiting in a pool's ready queue, by a loose scan of the ready index (one
# probe per tenant, however long its queue), or the worker's own tenant; then for each,
# how many of its first $5 runs the worker can take are in each priority class — with
# the tenant's name and limits and the pool's own P0 share, all in one round trip.
# A run's own due instant, for its worker and the start-lateness metric: a workflow's
# node run is due when it became ready (its fire_at; its due_at is its workflow run's).
_OWN_DUE = "CASE WHEN r.node = '' THEN r.due_at ELSE r.fire_at END"

_READY_TEMPLATE = """
WITH RECURSIVE t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now),
waiting AS (
    SELECT CASE WHEN $3::uuid IS NOT NULL THEN $3::uuid ELSE (
        SELECT tenant_id FROM runs r
        WHERE pool = $2 AND {QUEUE}
        ORDER BY tenant_id LIMIT 1) END AS tenant_id
    UNION ALL
    SELECT (SELECT tenant_id FROM runs r
            WHERE pool = $2 AND {QUEUE}
              AND tenant_id > w.tenant_id
            ORDER BY tenant_id LIMIT 1)
    FROM waiting w WHERE w.tenant_id IS NOT NULL AND $3::uuid IS NULL
)
SELECT w.tenant_id, tn.name, tn.limits::text AS limits, s.priority, s.n,
       (SELECT p0_reserved_share FROM pools WHERE name = $2) AS share, (SELECT now FROM t) AS now
FROM waiting w
JOIN tenants tn ON tn.id = w.tenant_id
CROSS JOIN LATERAL (
    SELECT c.priority, count(*) AS n FROM (
        SELECT r.priority FROM runs r
        WHERE r.tenant_id = w.tenant_id AND {TAKEABLE}
        ORDER BY r.priority, r.fire_at
        LIMIT $5
    ) c GROUP BY c.priority
) s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, (SELECT p0_reserved_share FROM pools WHERE name = $2),
       (SELECT now FROM t)
"""
_READY = _READY_TEMPLATE.format(QUEUE=READY, TAKEABLE=_TAKEABLE_READ)
# The gated queue's, through ``ix_runs_gated`` ($7 the tasks, $8 the tags).
_READY_GATED = _READY_TEMPLATE.format(
    QUEUE=GATED,
    TAKEABLE=_GATED_TAKEABLE.format(
        pool="$2", caps="$4", tags="$8", webhooks_only="$6", tasks="$7"
    ),
)

_LEASE = f"""
{NOW},
{_LIVE_WORKER.format(worker="$5")},
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
-- What admission granted ($11 tenants, $12 classes, $13 counts): each tenant's oldest
-- runs of each class the worker can take, by the ready index, locked or stepped over.
picked AS (
    SELECT p.id, g.priority, p.fire_at
    FROM unnest($11::uuid[], $12::smallint[], $13::int[]) AS g(tenant_id, priority, n)
    CROSS JOIN LATERAL (
        SELECT r.id, r.fire_at FROM runs r
        WHERE r.tenant_id = g.tenant_id AND r.priority = g.priority
          AND ($3::uuid IS NULL OR r.tenant_id = $3)
          AND {_TAKEABLE_LEASE}
        ORDER BY r.fire_at
        LIMIT g.n
        FOR UPDATE SKIP LOCKED
    ) p
    WHERE EXISTS (SELECT 1 FROM live)
),
-- Numbered, and tokens drawn, in the order of the batch: highest class, oldest first.
numbered AS (
    SELECT id, n, nextval('fencing_tokens') AS token
    FROM (SELECT id, row_number() OVER (ORDER BY priority, fire_at, id) AS n FROM picked
          ORDER BY n) o
),
-- Due now: RUNNING with a new attempt. Due later: reserved for this worker under the
-- attempt id and token it will start with. Either way the attempt id is the caller's
-- ($8, one per row in batch order).
leased AS (
UPDATE runs r SET
    state = CASE WHEN r.fire_at <= t.now THEN 'RUNNING' ELSE 'DISPATCHED' END,
    attempt = r.attempt + (r.fire_at <= t.now)::int,
    started_at = CASE WHEN r.fire_at <= t.now THEN COALESCE(r.started_at, t.now)
                      ELSE r.started_at END,
    wait_reason = NULL,
    reserved_by = CASE WHEN r.fire_at <= t.now THEN NULL ELSE $5::uuid END,
    reserved_attempt = CASE WHEN r.fire_at <= t.now THEN NULL
                            ELSE ($8::uuid[])[numbered.n] END,
    reserved_token = CASE WHEN r.fire_at <= t.now THEN NULL ELSE numbered.token END,
    reserved_until = CASE WHEN r.fire_at <= t.now THEN NULL
                          ELSE r.fire_at + make_interval(secs => r.heartbeat_timeout) END
FROM numbered, t
WHERE r.id = numbered.id
RETURNING r.id, r.tenant_id, r.job_id, r.attempt, r.task, r.webhook, r.payload, r.timeout,
          r.heartbeat_timeout, r.progress_timeout, {_OWN_DUE} AS due_at, r.priority, r.fire_at,
          r.workflow_run_id,
          t.now AS now, r.state,
          ($8::uuid[])[numbered.n] AS attempt_id, r.reserved_until,
          numbered.token AS token
),
-- The started runs' attempts and their transitions, written by this same statement: a
-- lease is one round trip, and on its own (no transaction around it) one commit.
started_attempts AS (
    INSERT INTO attempts (id, tenant_id, run_id, number, worker_id, fencing_token, state,
                          lease_expires_at, deadline, started_at, progress_deadline)
    SELECT l.attempt_id, l.tenant_id, l.id, l.attempt, $5::uuid, l.token, 'RUNNING',
           l.now + make_interval(secs => l.heartbeat_timeout),
           l.now + make_interval(secs => l.timeout), l.now,
           l.now + make_interval(secs => l.progress_timeout)
    FROM leased l WHERE l.state = 'RUNNING'
),
started_events AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state,
                        to_state, actor, data)
    SELECT l.tenant_id, l.now, 'run.transition', l.job_id, l.id, l.attempt_id,
           '{START.source.value}', '{RunState.RUNNING.value}', 'worker:' || $5::text,
           jsonb_build_object('attempt', l.attempt, 'fencing_token', l.token)
    FROM leased l WHERE l.state = 'RUNNING'
)
-- One row at least, leased or not: ``gone`` (the worker is not live) comes back in the
-- same round trip as the runs.
SELECT leased.*, NOT EXISTS (SELECT 1 FROM live) AS gone
FROM (SELECT 1) AS one LEFT JOIN leased ON TRUE
"""


_GATED_TAKEABLE_LEASE = _GATED_TAKEABLE.format(
    pool="$2", caps="$4", tags="$9", webhooks_only="$6", tasks="$8"
)
# A gated lease: what admission granted of the gated queue ($10 tenants, $11 classes,
# $12 counts), reserved for the worker under the attempt ids ($7) and tokens they will
# start with, left PENDING. The reservation lapses after the node's heartbeat timeout
# unless its gate opens first (``dag.py`` then gives its holder as long again).
_LEASE_GATED = f"""
{NOW},
{_LIVE_WORKER.format(worker="$5")},
picked AS (
    SELECT p.id, g.priority, p.fire_at
    FROM unnest($10::uuid[], $11::smallint[], $12::int[]) AS g(tenant_id, priority, n)
    CROSS JOIN LATERAL (
        SELECT r.id, r.fire_at FROM runs r
        WHERE r.tenant_id = g.tenant_id AND r.priority = g.priority
          AND ($3::uuid IS NULL OR r.tenant_id = $3)
          AND {_GATED_TAKEABLE_LEASE}
        ORDER BY r.fire_at
        LIMIT g.n
        FOR UPDATE SKIP LOCKED
    ) p
    WHERE EXISTS (SELECT 1 FROM live)
),
numbered AS (
    SELECT id, n, nextval('fencing_tokens') AS token
    FROM (SELECT id, row_number() OVER (ORDER BY priority, fire_at, id) AS n FROM picked
          ORDER BY n) o
),
leased AS (
UPDATE runs r SET
    wait_reason = NULL,
    reserved_by = $5::uuid,
    reserved_attempt = ($7::uuid[])[numbered.n],
    reserved_token = numbered.token,
    reserved_until = t.now + make_interval(secs => r.heartbeat_timeout)
FROM numbered, t
WHERE r.id = numbered.id
RETURNING r.id, r.tenant_id, r.job_id, r.attempt, r.task, r.webhook, r.payload, r.timeout,
          r.heartbeat_timeout, r.progress_timeout, r.priority, r.fire_at, r.workflow_run_id,
          t.now AS now, ($7::uuid[])[numbered.n] AS attempt_id, r.reserved_until,
          numbered.token AS token
)
SELECT leased.*, NOT EXISTS (SELECT 1 FROM live) AS gone
FROM (SELECT 1) AS one LEFT JOIN leased ON TRUE
"""


def _tasks_param(worker: Worker) -> str | None:
    """The worker's tasks as the keys of a JSON object (None: it runs any task)."""
    return None if worker.tasks is None else json.dumps(dict.fromkeys(worker.tasks, 1))


async def ready_queue(
    conn: Raw,
    *,
    now: datetime | None,
    worker: Worker,
    max: int,
    webhooks_only: bool = False,
    ahead: float = 0.0,
    later: bool = False,
    gated: bool = False,
) -> ReadyQueue:
    """What the worker could take of its pool's ready queue, tenant by tenant and
    class by class (up to ``max`` of each tenant), with what admission needs to know;
    ``gated``: of the gated queue instead."""
    fits = (
        worker.pool,
        worker.tenant_id,
        json.dumps(sorted(worker.capabilities)),
        max,
        webhooks_only,
    )
    tasks, tags = _tasks_param(worker), json.dumps(sorted(set(worker.tags)))
    if gated:
        rows = await conn.fetch(_READY_GATED, now, *fits, tasks, tags)
    else:
        rows = await conn.fetch(_READY, now, *fits, ahead, tasks, tags, later)
    supply: dict[uuid.UUID, dict[int, int]] = {}
    limits: dict[uuid.UUID, dict[str, Any]] = {}
    names: dict[uuid.UUID, str] = {}
    for r in rows:
        if r["tenant_id"] is None:  # the last row: the pool's share and the clock alone
            continue
        supply.setdefault(r["tenant_id"], {})[r["priority"]] = r["n"]
        limits[r["tenant_id"]] = json.loads(r["limits"])
        names[r["tenant_id"]] = r["name"]
    last = rows[-1]
    return ReadyQueue(last["now"], last["share"], supply, limits, names)


async def lease(
    conn: Raw,
    *,
    now: datetime | None,
    worker: Worker,
    grants: Sequence[Grant],
    new_id: Callable[[], uuid.UUID],
    webhooks_only: bool = False,
    ahead: float = 0.0,
    later: bool = False,
    gated: bool = False,
) -> tuple[list[LeasedAttempt], dict[tuple[uuid.UUID, int], int]]:
    """Take what admission granted (none: only check the worker is live, and note it
    seen). Returns the attempts and how many runs each (tenant, class) gave.
    ``gated``: of the gated queue, each reserved ahead of its gate."""
    total = sum(g.count for g in grants)
    who = (
        worker.pool,
        worker.tenant_id,
        json.dumps(sorted(worker.capabilities)),
        worker.id,
        webhooks_only,
    )
    ids = [new_id() for _ in range(total)]
    routes = (_tasks_param(worker), json.dumps(sorted(set(worker.tags))))
    granted = (
        [g.tenant_id for g in grants],
        [g.priority for g in grants],
        [g.count for g in grants],
    )
    if gated:
        rows = await conn.fetch(_LEASE_GATED, now, *who, ids, *routes, *granted)
    else:
        rows = await conn.fetch(_LEASE, now, *who, ahead, ids, *routes, *granted, later)
    if rows[0]["gone"]:
        raise WorkerGone(worker.id)
    if rows[0]["id"] is None:  # the one row of an empty lease
        return [], {}
    got: dict[tuple[uuid.UUID, int], int] = {}
    for r in rows:
        key = (r["tenant_id"], r["priority"])
        got[key] = got.get(key, 0) + 1
    rows = sorted(rows, key=lambda r: (r["priority"], r["fire_at"]))
    if gated:
        # As if it began now: its deadline is counted again from its gate's opening.
        return [_reserved(r, begins=r["now"], due_at=r["now"], gated=True) for r in rows], got
    leased: list[LeasedAttempt] = []
    for r in rows:
        at: datetime = r["now"]
        if r["state"] == "DISPATCHED":  # reserved: starts at its instant, when confirmed
            leased.append(_reserved(r, begins=r["fire_at"], due_at=r["due_at"], gated=False))
            continue
        attempt_id = r["attempt_id"]
        # As the statement wrote them.
        lease_until = at + timedelta(seconds=r["heartbeat_timeout"])
        deadline = at + timedelta(seconds=r["timeout"])
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
                priority=r["priority"],
                workflow_run_id=r["workflow_run_id"],
            )
        )
    return leased, got


def _reserved(r: Any, *, begins: datetime, due_at: datetime, gated: bool) -> LeasedAttempt:
    """A reservation as a lease answers it: ahead of its instant ``begins`` (when it
    will start), or ``gated`` ahead of its gate (``begins``: the lease's time)."""
    return LeasedAttempt(
        attempt_id=r["attempt_id"],
        run_id=r["id"],
        tenant_id=r["tenant_id"],
        job_id=r["job_id"],
        number=r["attempt"] + 1,
        task=r["task"],
        webhook=r["webhook"],
        payload=r["payload"],
        fencing_token=r["token"],
        lease_expires_at=r["reserved_until"],
        deadline=begins + timedelta(seconds=r["timeout"]),
        due_at=due_at,
        heartbeat_timeout=r["heartbeat_timeout"],
        not_before=None if gated else begins,
        progress_timeout=r["progress_timeout"],
        priority=r["priority"],
        workflow_run_id=r["workflow_run_id"],
        gated=gated,
    )


_START = f"""
{NOW},
{_LIVE_WORKER.format(worker="$3")},
-- The reservations named, found through the reservation index by token, always: with
-- statistics that lag a burst the planner would rather read every ready run (IS TRUE
-- keeps the state condition from pointing it at the ready-queue index). Reserved ahead
-- of an instant (DISPATCHED), or ahead of a gate (PENDING).
found AS MATERIALIZED (
    SELECT id FROM runs
    WHERE EXISTS (SELECT 1 FROM live)
      AND reserved_token = ANY($2::bigint[]) AND reserved_token IS NOT NULL
      AND (state IN ('{START.source}', 'PENDING')) IS TRUE AND reserved_by = $3
      AND ($4::uuid IS NULL OR tenant_id = $4)
),
-- Then locked, by primary key in id order, as every path that changes many runs takes
-- them (a cancel, a pause, in bulk or of a job): in the tokens' order (the lease's:
-- highest class, soonest first) a run could be held while another is waited for, held
-- by such a path waiting for it. One that such a path changed first is read again.
picked AS MATERIALIZED (
    SELECT id, reserved_attempt, reserved_token, fire_at, state, o.at AS opened,
           o.payload AS opened_payload,
           -- Due: within $5 seconds of its instant, or its gate open (read by the caller
           -- under this reservation: $6 tokens, $7 payloads, $8 instants).
           CASE WHEN state = 'PENDING' THEN o.token IS NOT NULL
                ELSE fire_at <= (SELECT now FROM t) + make_interval(secs => $5) END AS due
    FROM runs
    LEFT JOIN unnest($6::bigint[], $7::jsonb[], $8::timestamptz[]) AS o(token, payload, at)
           ON o.token = runs.reserved_token
    WHERE id = ANY(ARRAY(SELECT id FROM found))
      AND (reserved_token = ANY($2::bigint[]) AND state IN ('{START.source}', 'PENDING')
           AND reserved_by = $3) IS TRUE
    ORDER BY id
    FOR UPDATE OF runs
),
-- Each by primary key, still under this reservation: it begins at the later of now and
-- its instant, or at its gate's opening (then due and dispatched as of it: the opening
-- left it PENDING). A cancel or pause that got the row first fails these conditions,
-- re-checked on its new version. (IS TRUE: the conditions must not lead the planner to
-- another index.)
started AS (
    UPDATE runs r SET state = 'RUNNING', attempt = r.attempt + 1,
                      started_at = COALESCE(r.started_at, p.opened, GREATEST(t.now, p.fire_at)),
                      fire_at = COALESCE(p.opened, r.fire_at),
                      dispatched_at = COALESCE(p.opened, r.dispatched_at),
                      payload = COALESCE(p.opened_payload, r.payload),
                      reason = CASE WHEN p.opened IS NULL THEN r.reason END,
                      wait_reason = NULL, reserved_by = NULL, reserved_attempt = NULL,
                      reserved_token = NULL, reserved_until = NULL
    FROM t, picked p
    WHERE r.id = p.id AND p.due
      AND (r.state = p.state AND r.reserved_token = p.reserved_token
           AND r.fire_at = p.fire_at) IS TRUE
    RETURNING r.id, r.tenant_id, r.job_id, r.attempt, {_OWN_DUE} AS due_at, r.heartbeat_timeout,
              r.timeout,
              r.progress_timeout, r.priority, p.reserved_attempt AS attempt_id,
              p.reserved_token AS token, p.opened,
              COALESCE(p.opened, GREATEST(t.now, p.fire_at)) AS now
),
att AS (
    INSERT INTO attempts (id, tenant_id, run_id, number, worker_id, fencing_token, state,
                          lease_expires_at, deadline, started_at, progress_deadline)
    SELECT attempt_id, tenant_id, id, attempt, $3, token, 'RUNNING',
           now + make_interval(secs => heartbeat_timeout), now + make_interval(secs => timeout),
           now, now + make_interval(secs => progress_timeout)
    FROM started
),
-- A node started at its gate went PENDING -> DISPATCHED at the opening, then RUNNING.
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state, to_state,
                        actor, reason, data)
    SELECT tenant_id, at, 'run.transition', job_id, id, attempt_id, from_state, to_state,
           actor, reason, data
    FROM (
        SELECT id, 0 AS step, tenant_id, opened AS at, job_id, NULL::uuid AS attempt_id,
               'PENDING' AS from_state, '{START.source}' AS to_state, NULL AS actor,
               '{UPSTREAM_DONE}' AS reason, NULL::jsonb AS data
        FROM started WHERE opened IS NOT NULL
        UNION ALL
        SELECT id, 1, tenant_id, now, job_id, attempt_id, '{START.source}', 'RUNNING',
               'worker:' || $3::text, NULL,
               jsonb_build_object('attempt', attempt, 'fencing_token', token)
        FROM started
    ) e
    ORDER BY id, step
)
SELECT token, now, CASE WHEN attempt = 1 THEN due_at END AS first_due, tenant_id, priority,
       FALSE AS gone
FROM started
UNION ALL
SELECT reserved_token, NULL, NULL, NULL, NULL, FALSE FROM picked WHERE NOT due
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, TRUE WHERE NOT EXISTS (SELECT 1 FROM live)
"""


async def start_many(
    conn: Raw,
    *,
    now: datetime | None,
    worker_id: uuid.UUID,
    tokens: Sequence[int],
    tenant_id: uuid.UUID | None,
    ahead: float,
    opened: Sequence[GateOpened] = (),
) -> ReservationsStarted:
    rows = await conn.fetch(
        _START,
        now,
        list(tokens),
        worker_id,
        tenant_id,
        ahead,
        [t for g in opened for t in g.fencing_tokens],
        [p for g in opened for p in [json.dumps(g.payload)] * len(g.fencing_tokens)],
        [g.opened_at for g in opened for _ in g.fencing_tokens],
    )
    if any(r["gone"] for r in rows):
        raise WorkerGone(worker_id)
    started = [r for r in rows if r["now"] is not None]
    done = {r["token"] for r in rows}
    return ReservationsStarted(
        started_at=min(r["now"] for r in started) if started else None,
        started=[r["token"] for r in started],
        not_yet=[r["token"] for r in rows if r["now"] is None],
        refused=[t for t in tokens if t not in done],
        first_tries=[
            (r["first_due"], r["now"], r["tenant_id"], r["priority"])
            for r in started
            if r["first_due"] is not None
        ],
    )


_COMPLETE = f"""
{NOW},
-- The runs are locked first, in id order, as every path that changes many runs at once
-- takes them (a cancel, a pause, in bulk or of a job): taken in the batch's own order,
-- a run could be held while another is waited for, held by such a path waiting for it.
ordered AS (
    SELECT r.id FROM runs r
    WHERE r.id IN (SELECT a.run_id FROM attempts a
                   WHERE a.id = ANY($2::uuid[]) AND a.state = 'RUNNING'
                     AND ($5::uuid IS NULL OR a.tenant_id = $5))
    ORDER BY r.id
    FOR UPDATE OF r
),
done AS (
    UPDATE attempts a SET state = 'SUCCEEDED', finished_at = t.now, result = v.result
    FROM t, unnest($2::uuid[], $3::bigint[], $4::jsonb[]) AS v(id, token, result)
    WHERE a.id = v.id AND a.fencing_token = v.token AND a.state = 'RUNNING'
      AND ($5::uuid IS NULL OR a.tenant_id = $5)
      AND (SELECT count(*) FROM ordered) >= 0  -- evaluated once, before any row
    RETURNING a.id, a.fencing_token, a.run_id, v.result, a.started_at, t.now AS now
),
finished AS (
    UPDATE runs SET state = CASE WHEN runs.cancel_requested THEN 'CANCELLED' ELSE 'SUCCESS' END,
                    finished_at = done.now, result = done.result,
                    reason = CASE WHEN runs.cancel_requested THEN 'cancelled while running' END
    FROM done
    WHERE runs.id = done.run_id AND {FINISH.sql("runs.state")}
    RETURNING runs.id, runs.tenant_id, runs.job_id, runs.state, runs.task, done.id AS attempt_id,
              done.now, runs.workflow_run_id, runs.origin
),
ev AS (
    INSERT INTO events (tenant_id, at, kind, job_id, run_id, attempt_id, from_state, to_state,
                        reason)
    SELECT tenant_id, now, 'run.transition', job_id, id, attempt_id, '{FINISH.source}', state,
           CASE WHEN state = 'CANCELLED' THEN 'cancelled while running' END
    FROM finished
),
jobs_done AS (
    UPDATE jobs SET state = 'finished', next_due_at = NULL, updated_at = t.now
    FROM t
    -- A one-off job's own run ended (origin once): not a run triggered beside it.
    WHERE jobs.id IN (SELECT job_id FROM finished
                      WHERE workflow_run_id IS NULL AND origin = 'once')
      AND jobs.state = 'active' AND jobs.kind IN ('at', 'delay', 'asap') AND jobs.workflow IS NULL
)
SELECT done.id, done.fencing_token, finished.state, finished.tenant_id, finished.task,
       extract(epoch FROM done.now - done.started_at)::float8 AS ran, finished.workflow_run_id
FROM done LEFT JOIN finished ON finished.attempt_id = done.id
"""


async def complete_many(
    conn: Raw,
    *,
    now: datetime | None,
    ids: Sequence[uuid.UUID],
    tokens: Sequence[int],
    results: Sequence[Any],
    tenant_id: uuid.UUID | None,
) -> Outcomes:
    # In attempt id order, as heartbeats name them: two statements updating the same
    # attempts through their arrays take them in the arrays' order (a nested loop by
    # primary key), and in opposite orders could each hold one the other waits for.
    order = sorted(range(len(ids)), key=lambda k: ids[k])
    encoded = [None if results[k] is None else json.dumps(results[k]) for k in order]
    rows = await conn.fetch(
        _COMPLETE,
        now,
        [ids[k] for k in order],
        [tokens[k] for k in order],
        encoded,
        tenant_id,
    )
    return {
        (r["id"], r["fencing_token"]): AttemptOutcome(
            r["id"],
            True,
            run_state=RunState(r["state"]) if r["state"] else None,
            tenant_id=r["tenant_id"],
            task=r["task"],
            ran=r["ran"],
            workflow_run_id=r["workflow_run_id"],
        )
        for r in rows
    }


_HEARTBEAT = """
WITH t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now)
UPDATE attempts a
SET lease_expires_at = t.now + make_interval(secs => r.heartbeat_timeout), heartbeat_at = t.now,
    progress_at = CASE WHEN v.progress THEN t.now ELSE a.progress_at END,
    progress_details = CASE WHEN v.progress THEN v.details::jsonb ELSE a.progress_details END,
    progress_deadline = CASE WHEN v.progress
                             THEN t.now + make_interval(secs => r.progress_timeout)
                             ELSE a.progress_deadline END
FROM t, runs r,
     unnest($2::uuid[], $3::bigint[], $5::boolean[], $6::text[]) AS v(id, token, progress, details)
WHERE a.id = v.id AND a.fencing_token = v.token AND a.state = 'RUNNING' AND r.id = a.run_id
  AND ($4::uuid IS NULL OR a.tenant_id = $4)
RETURNING a.id, a.fencing_token, a.lease_expires_at, r.cancel_requested, r.state
"""


async def heartbeat_many(
    conn: Raw,
    *,
    now: datetime | None,
    items: Sequence[HeartbeatItem],
    tenant_id: uuid.UUID | None,
) -> Outcomes:
    # One row per (attempt, token), carrying its last report: an UPDATE … FROM applies
    # only one of several rows joining the same attempt, and not a chosen one.
    reports = {(i.attempt_id, i.fencing_token): i for i in last_reports(items)}
    beats = list(({(i.attempt_id, i.fencing_token): i for i in items} | reports).values())
    beats.sort(key=lambda i: i.attempt_id)  # in id order, as completions (complete_many)
    rows = await conn.fetch(
        _HEARTBEAT,
        now,
        [i.attempt_id for i in beats],
        [i.fencing_token for i in beats],
        tenant_id,
        [i.progress for i in beats],
        [None if i.details is None else json.dumps(i.details) for i in beats],
    )
    return {
        (r["id"], r["fencing_token"]): AttemptOutcome(
            r["id"],
            True,
            lease_expires_at=r["lease_expires_at"],
            cancel_requested=r["cancel_requested"],
            run_state=RunState(r["state"]),
        )
        for r in rows
    }
