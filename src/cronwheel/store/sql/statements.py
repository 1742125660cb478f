"""Portable statements (SQLAlchemy Core) that both the store's logic and a driver's
own statements are built from: written once, with the driver's dialect hooks."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.spec import ONE_OFF_KINDS
from cronwheel.domain.states import TERMINAL_STATES, AttemptState, JobState, Move, RunState
from cronwheel.store.driver import Driver, lease_fence
from cronwheel.store.schema import attempts, jobs, runs, shard_leases, workers
from cronwheel.store.values import CompleteItem, FailItem, HeartbeatItem

__all__ = [
    "ONE_OFF_KINDS",
    "PAUSED_REASON",
    "attempts_end",
    "attempts_live",
    "free_shard_leases",
    "insert_ignoring",
    "jobs_finish_one_off",
    "may",
    "shard_held",
    "shard_leases_take",
    "update_each",
    "workers_held",
    "workers_live",
]

# The reason a run of a paused job carries while it is parked (``store/sql/jobs.py``).
PAUSED_REASON = "job paused"


def may(move: Move, state: sa.ColumnElement[Any] = runs.c.state) -> sa.ColumnElement[bool]:
    """The precondition of ``move``: ``state`` is one the move may leave."""
    values = move.source_values
    return state == values[0] if len(values) == 1 else state.in_(values)


def workers_live(at: datetime | sa.ColumnElement[Any], ttl: float) -> sa.ColumnElement[bool]:
    """The workers that count as live at ``at`` (an instant, or the statement's clock):
    not deregistered, and seen (registered, or a lease call) within ``ttl`` seconds or
    holding an attempt whose lease has not expired (a busy worker heartbeats instead of
    leasing)."""
    holding = (
        sa.select(attempts.c.id)
        .where(
            attempts.c.worker_id == workers.c.id,
            attempts.c.state == AttemptState.RUNNING.value,
            attempts.c.lease_expires_at > at,
        )
        .exists()
    )
    return sa.and_(
        workers.c.deregistered_at.is_(None),
        sa.or_(workers.c.last_seen_at >= at - timedelta(seconds=ttl), holding),
    )


def workers_held(
    tenant_id: uuid.UUID | None,
) -> tuple[sa.ScalarSelect[int], sa.ScalarSelect[int]]:
    """What each worker (correlated to ``workers``) holds now: its RUNNING attempts,
    through the worker index, and the runs reserved for it, through the reservation
    index (few rows: the reservations held now). Each takes one of its slots. With
    ``tenant_id``, only that tenant's (a shared worker's other tenants' runs are not
    told)."""
    holding = [
        attempts.c.worker_id == workers.c.id,
        attempts.c.state == AttemptState.RUNNING.value,
    ]
    reserving = [
        runs.c.reserved_token.is_not(None),
        runs.c.reserved_by == workers.c.id,
        runs.c.state == RunState.DISPATCHED.value,
    ]
    if tenant_id is not None:
        holding.append(attempts.c.tenant_id == tenant_id)
        reserving.append(runs.c.tenant_id == tenant_id)
    running = sa.select(sa.func.count()).where(*holding).scalar_subquery()
    reserved = sa.select(sa.func.count()).where(*reserving).scalar_subquery()
    return running, reserved


async def update_each(
    conn: AsyncConnection,
    table: sa.Table,
    rows: list[dict[str, Any]],
    *,
    where: sa.ColumnElement[bool] | None = None,
) -> None:
    """Per-row values in one executemany: each row is ``{"id": …, column: value}``;
    ``where`` is a precondition every row must still meet."""
    if not rows:
        return
    columns = [k for k in rows[0] if k != "id"]
    stmt = (
        table.update()
        .where(table.c.id == sa.bindparam("b_id"), sa.true() if where is None else where)
        .values({c: sa.bindparam(f"b_{c}") for c in columns})
    )
    await conn.execute(stmt, [{f"b_{k}": v for k, v in row.items()} for row in rows])


async def insert_ignoring(
    conn: AsyncConnection,
    driver: Driver,
    table: sa.Table,
    rows: list[dict[str, Any]],
    returning: Sequence[sa.ColumnElement[Any]] = (),
) -> list[Any]:
    """INSERT ``rows``, skipping those whose key exists; returns ``returning`` of the
    rows inserted. Executed as one executemany (SQLAlchemy's "insertmanyvalues"): the
    statement is compiled once, whatever the number of rows."""
    if not rows:
        return []
    stmt = driver.insert_ignore(table, [])
    if returning:
        return list((await conn.execute(stmt.returning(*returning), rows)).all())
    await conn.execute(stmt, rows)
    return []


def attempts_live(
    items: Sequence[HeartbeatItem | CompleteItem | FailItem], tenant_id: uuid.UUID | None
) -> sa.ColumnElement[bool]:
    """The attempts of ``items`` still live under exactly the (id, token) given (and,
    for a tenant's worker, that tenant's)."""
    pairs = [(i.attempt_id, i.fencing_token) for i in items]
    live = sa.and_(
        sa.tuple_(attempts.c.id, attempts.c.fencing_token).in_(pairs),
        attempts.c.state == AttemptState.RUNNING.value,
    )
    return live if tenant_id is None else sa.and_(live, attempts.c.tenant_id == tenant_id)


async def attempts_end(
    conn: AsyncConnection,
    items: Sequence[HeartbeatItem | CompleteItem | FailItem],
    state: AttemptState,
    at: datetime,
    tenant_id: uuid.UUID | None,
) -> tuple[dict[uuid.UUID, uuid.UUID], set[tuple[uuid.UUID, int]]]:
    """End the live attempts among ``items``; returns ``{attempt_id: run_id}`` and the
    (attempt id, token) pairs that ended. Their runs are locked first, in id order, as
    every path that changes many runs at once takes them (a cancel or a pause, in bulk
    or of a job): taken in the batch's own order, one could be held while another is
    waited for, held by such a path waiting for the first."""
    live = attempts_live(items, tenant_id)
    await conn.execute(
        sa.select(runs.c.id)
        .where(runs.c.id.in_(sa.select(attempts.c.run_id).where(live)))
        .order_by(runs.c.id)
        .with_for_update()
    )
    rows = (
        await conn.execute(
            attempts.update()
            .where(live)
            .values(state=state.value, finished_at=at)
            .returning(attempts.c.id, attempts.c.run_id, attempts.c.fencing_token)
        )
    ).all()
    return {r.id: r.run_id for r in rows}, {(r.id, r.fencing_token) for r in rows}


async def jobs_finish_one_off(
    conn: AsyncConnection,
    driver: Driver,
    job_ids: Sequence[uuid.UUID],
    at: datetime,
    *,
    workflows: bool = False,
) -> None:
    """A one-off job has one run of its own (origin ``once``): it is finished when that
    run has ended, however (every path that ends runs calls this, after ending them in
    the same transaction: results, failures, quarantine). A run triggered beside it
    ending does not finish it: its own is still to come. A one-off workflow is finished
    when its workflow run ends (``workflows``), not when a node run does."""
    if not job_ids:
        return
    own_run_pending = (
        sa.select(runs.c.id)
        .where(
            runs.c.tenant_id == jobs.c.tenant_id,
            runs.c.job_id == jobs.c.id,
            runs.c.origin == "once",
            runs.c.state.not_in([s.value for s in TERMINAL_STATES]),
        )
        .exists()
    )
    await conn.execute(
        jobs.update()
        .where(
            driver.id_in(jobs.c.id, list(set(job_ids))),
            jobs.c.kind.in_(ONE_OFF_KINDS),
            jobs.c.state == JobState.ACTIVE.value,
            jobs.c.workflow.is_not(None) if workflows else jobs.c.workflow.is_(None),
            ~own_run_pending,
        )
        .values(state=JobState.FINISHED.value, next_due_at=None, updated_at=at)
    )


def free_shard_leases(shards: Sequence[int]) -> list[dict[str, Any]]:
    """Rows of shard leases no node holds yet."""
    return [{"shard": s, "owner": None, "epoch": 0, "expires_at": None} for s in shards]


def shard_held(
    shard: sa.ColumnElement[Any],
    *,
    node_id: str,
    at: datetime,
    epochs: dict[int, int] | None = None,
) -> sa.ColumnElement[bool]:
    """``shard`` is leased by ``node_id``, the lease is unexpired at ``at`` and, with
    ``epochs``, it is the lease of that epoch."""
    held = sa.select(shard_leases.c.shard).where(*lease_fence(node_id, at, epochs))
    return shard.in_(held.scalar_subquery())


async def shard_leases_take(
    conn: AsyncConnection,
    driver: Driver,
    *,
    node_id: str,
    shards: Sequence[int],
    ttl: float,
    limit: int | None,
    at: datetime,
) -> dict[int, int]:
    """Renew ``node_id``'s own leases among ``shards`` (the epoch stays) and take up to
    ``limit`` more: expired leases first (their owner died or stalled: failover comes
    first), then free ones (never owned, or handed back), in shard order, skipping rows
    locked by a node taking at the same moment. A change of owner bumps the epoch.
    Returns every lease ``node_id`` holds, shard → epoch."""
    expires = at + timedelta(seconds=ttl)
    wanted = list(shards)
    if wanted:
        existing = {
            r.shard
            for r in await conn.execute(
                sa.select(shard_leases.c.shard).where(driver.id_in(shard_leases.c.shard, wanted))
            )
        }
        missing = [s for s in wanted if s not in existing]
        if missing:
            await conn.execute(
                driver.insert_ignore(
                    shard_leases,
                    free_shard_leases(missing),
                )
            )
        await conn.execute(
            shard_leases.update()
            .where(
                driver.id_in(shard_leases.c.shard, wanted),
                shard_leases.c.owner == node_id,
                shard_leases.c.expires_at > at,
            )
            .values(expires_at=expires)
        )
        own = (
            await conn.execute(
                sa.select(sa.func.count()).where(
                    shard_leases.c.owner == node_id, shard_leases.c.expires_at > at
                )
            )
        ).scalar_one()
        room = len(wanted) if limit is None else max(0, limit - own)
        if room:
            takeable = (
                sa.select(shard_leases.c.shard)
                .where(
                    driver.id_in(shard_leases.c.shard, wanted),
                    sa.or_(shard_leases.c.owner.is_(None), shard_leases.c.expires_at <= at),
                )
                .order_by(shard_leases.c.owner.is_(None), shard_leases.c.shard)
                .limit(room)
                .with_for_update(skip_locked=True)
            )
            picked = [r.shard for r in await conn.execute(takeable)]
            if picked:
                await conn.execute(
                    shard_leases.update()
                    .where(driver.id_in(shard_leases.c.shard, picked))
                    .values(owner=node_id, expires_at=expires, epoch=shard_leases.c.epoch + 1)
                )
    held = await conn.execute(
        sa.select(shard_leases.c.shard, shard_leases.c.epoch).where(
            shard_leases.c.owner == node_id, shard_leases.c.expires_at > at
        )
    )
    return {r.shard: r.epoch for r in held}
