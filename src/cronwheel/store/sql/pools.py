"""Pools: their settings (``pools``), what their live workers can take now, and the
backlog waiting for them (``domain/pools.py`` defines the words).

Costs. The workers' side reads the live workers (few rows) with what each holds
through the worker and reservation indexes (``statements.workers_held``). The backlog
counts the ready queue through its partial index ``ix_runs_ready`` (pool, tenant,
priority, fire time), index only, and the due SCHEDULED runs through the due index
(``ix_runs_due``: shard, fire time, one range per shard) or, for a tenant with few,
its own ``(tenant_id, state)``: both read only the rows they count. For one tenant,
the ready count takes the pools of the queue first (a skip scan: one index probe per
pool) and then only that tenant's range of each pool, so another tenant's volume is
never read.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.admission import reserved_slots
from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.pools import (
    Pool,
    PoolBacklog,
    PoolCapacity,
    PoolStatus,
    effective_share,
)
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.store.driver import Driver
from cronwheel.store.rows import event_row
from cronwheel.store.schema import READY, pools, runs, tenants, workers
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.statements import workers_held, workers_live

__all__ = ["PoolsMixin", "backlog_statements"]

_SCHEDULED = sa.text("runs.state = 'SCHEDULED'")  # the due index's predicate, as written
_ALL_SHARDS = list(range(NUM_SHARDS))


def _worker_loads(
    at: Any, worker_ttl: float, tenant_id: uuid.UUID | None, names: Sequence[str] | None
) -> sa.Select[Any]:
    """Live workers grouped by (pool, owner, capacity): how many, the slots they hold,
    the slots free (per worker, never below 0), and the pool's own P0 share. The owner
    is the tenant a worker serves alone (None: shared)."""
    running, reserved = workers_held(tenant_id)
    held = (running + reserved).label("held")
    columns = (workers.c.pool, workers.c.tenant_id, workers.c.capacity, held)
    live = sa.select(*columns).where(workers_live(at, worker_ttl))
    if tenant_id is not None:  # its own workers and the shared ones
        live = live.where(sa.or_(workers.c.tenant_id == tenant_id, workers.c.tenant_id.is_(None)))
    if names is not None:
        live = live.where(workers.c.pool.in_(list(names)))
    w = live.subquery("w")
    free = sa.case((w.c.held < w.c.capacity, w.c.capacity - w.c.held), else_=0)
    return (
        sa.select(
            w.c.pool,
            w.c.tenant_id.label("owner"),
            w.c.capacity,
            sa.func.count().label("workers"),
            sa.func.sum(w.c.held).label("held"),
            sa.func.sum(free).label("free"),
            pools.c.p0_reserved_share,
        )
        .select_from(w.outerjoin(pools, pools.c.name == w.c.pool))
        .group_by(w.c.pool, w.c.tenant_id, w.c.capacity, pools.c.p0_reserved_share)
    )


def backlog_statements(
    driver: Driver,
    tenant_id: uuid.UUID | None,
    names: Sequence[str] | None,
    at: datetime,
    *,
    ready_pools: Sequence[str] | None = None,
) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """The counts of ready and of due runs by (pool, tenant, priority): of ``names``
    only, of ``tenant_id`` only. ``ready_pools``: the pools of the ready queue, when
    ``names`` is None, so that one tenant's count is a range of the ready index per
    pool."""
    key = (runs.c.pool, runs.c.tenant_id, runs.c.priority)
    ready = sa.select(*key, sa.func.count().label("n")).where(sa.text(READY))
    due = sa.select(*key, sa.func.count().label("n")).where(
        _SCHEDULED, driver.id_in(runs.c.shard, _ALL_SHARDS), runs.c.fire_at <= at
    )
    if tenant_id is not None:
        ready = ready.where(runs.c.tenant_id == tenant_id)
        due = due.where(runs.c.tenant_id == tenant_id)
    if names is not None:
        due = due.where(runs.c.pool.in_(list(names)))
    in_ready = names if names is not None else ready_pools
    if in_ready is not None:
        ready = ready.where(runs.c.pool.in_(list(in_ready)))
    return ready.group_by(*key), due.group_by(*key)


class _Load:
    """One pool's live workers, summed from their (pool, capacity) groups."""

    __slots__ = ("busy", "capacity", "free", "free_by_owner", "reserved", "share", "workers")

    def __init__(self, share: float) -> None:
        self.share = share
        self.workers = self.capacity = self.busy = self.free = self.reserved = 0
        self.free_by_owner: dict[uuid.UUID | None, int] = {}

    def add(self, row: Any) -> None:
        count, capacity = int(row.workers), int(row.capacity)
        self.workers += count
        self.capacity += count * capacity
        self.busy += int(row.held or 0)
        self.free += int(row.free or 0)
        owner = row.owner
        self.free_by_owner[owner] = self.free_by_owner.get(owner, 0) + int(row.free or 0)
        self.reserved += count * reserved_slots(capacity, self.share)


def _loads(rows: Sequence[Any], default_share: float) -> dict[str, _Load]:
    out: dict[str, _Load] = {}
    for row in rows:
        load = out.get(row.pool)
        if load is None:
            share = effective_share(row.p0_reserved_share, default_share)
            load = out[row.pool] = _Load(share)
        load.add(row)
    return out


class PoolsMixin(SqlCore):
    async def pools_set(
        self,
        name: str,
        *,
        p0_reserved_share: float | None,
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Pool:
        share = p0_reserved_share
        if share is not None and not 0.0 <= share <= 1.0:  # NaN fails too
            raise ValidationError(
                "p0_reserved_share must be between 0 and 1, or null for the default",
                field="p0_reserved_share",
            )
        async with self._write() as conn:
            at = await self._now(conn, now)
            before = await self._pool_row(conn, name)
            if before is None:
                await conn.execute(
                    self.driver.insert_ignore(
                        pools, [{"name": name, "p0_reserved_share": share, "updated_at": at}]
                    )
                )
            await conn.execute(
                pools.update()
                .where(pools.c.name == name)
                .values(p0_reserved_share=share, updated_at=at)
            )
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="pool.updated",
                        tenant_id=None,
                        actor=name_of(actor),
                        data={
                            "pool": name,
                            "p0_reserved_share": share,
                            "previous": None if before is None else before.p0_reserved_share,
                        },
                    )
                ],
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=None,
                action="pool.update",
                target_kind="pool",
                target_id=name,
                before={"p0_reserved_share": None if before is None else before.p0_reserved_share},
                after={"p0_reserved_share": share},
            )
        return Pool(name=name, p0_reserved_share=share, updated_at=at)

    async def pools_get(self, name: str) -> Pool:
        async with self._read() as conn:
            row = await self._pool_row(conn, name)
        if row is None:
            return Pool(name=name, p0_reserved_share=None, updated_at=None)
        return Pool(name=name, p0_reserved_share=row.p0_reserved_share, updated_at=row.updated_at)

    @staticmethod
    async def _pool_row(conn: AsyncConnection, name: str) -> Any:
        return (await conn.execute(pools.select().where(pools.c.name == name))).first()

    async def pools_capacity(
        self,
        *,
        default_share: float = 0.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> dict[str, PoolCapacity]:
        async with self._read() as conn:
            at = await self._statement_now(conn, now)
            rows = (await conn.execute(_worker_loads(at, worker_ttl, None, None))).all()
        return {
            pool: PoolCapacity(
                pool=pool,
                workers=load.workers,
                capacity=load.capacity,
                busy=load.busy,
                free=load.free,
                p0_reserved_share=load.share,
                p0_reserved_slots=load.reserved,
                free_by_owner=load.free_by_owner,
            )
            for pool, load in _loads(rows, default_share).items()
        }

    async def pools_status(
        self,
        tenant_id: uuid.UUID | None,
        *,
        names: Sequence[str] | None = None,
        default_share: float = 0.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> list[PoolStatus]:
        async with self._read() as conn, self.driver.planned_each(conn):
            at = await self._now(conn, now)
            loads = _loads(
                (await conn.execute(_worker_loads(at, worker_ttl, tenant_id, names))).all(),
                default_share,
            )
            backlog = await self._pools_backlog(conn, tenant_id, names, at)
            listed = set(loads) | set(backlog) if names is None else set(names)
            settings = {
                r.name: r.p0_reserved_share
                for r in await conn.execute(
                    sa.select(pools.c.name, pools.c.p0_reserved_share).where(
                        pools.c.name.in_(sorted(listed))
                    )
                )
            }
        out = []
        for name in sorted(listed):
            share = settings.get(name)
            load = loads.get(name) or _Load(effective_share(share, default_share))
            out.append(
                PoolStatus(
                    name=name,
                    p0_reserved_share=share,
                    effective_share=effective_share(share, default_share),
                    workers=load.workers,
                    capacity=load.capacity,
                    busy=load.busy,
                    free=load.free if tenant_id is None else None,
                    p0_reserved_slots=load.reserved,
                    backlog=backlog.get(name, []),
                )
            )
        return out

    async def _pools_backlog(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID | None,
        names: Sequence[str] | None,
        at: datetime,
    ) -> dict[str, list[PoolBacklog]]:
        """Ready and due runs by pool, tenant and priority (see the module's costs)."""
        ready_pools = None
        if tenant_id is not None and names is None:
            ready_pools = await self._ready_pools(conn)
        statements = backlog_statements(self.driver, tenant_id, names, at, ready_pools=ready_pools)
        counts: dict[tuple[str, uuid.UUID, int], list[int]] = defaultdict(lambda: [0, 0])
        for i, stmt in enumerate(statements):
            for r in await conn.execute(stmt):
                counts[(r.pool, r.tenant_id, r.priority)][i] += int(r.n)
        if not counts:
            return {}
        tenant_ids = sorted({t for _p, t, _c in counts}, key=str)
        names_of = {
            r.id: r.name
            for r in await conn.execute(
                sa.select(tenants.c.id, tenants.c.name).where(
                    self.driver.id_in(tenants.c.id, tenant_ids)
                )
            )
        }
        out: dict[str, list[PoolBacklog]] = defaultdict(list)
        for (pool, tid, priority), (n_ready, n_due) in sorted(
            counts.items(), key=lambda kv: (kv[0][0], kv[0][2], names_of.get(kv[0][1], ""))
        ):
            out[pool].append(
                PoolBacklog(
                    tenant_id=tid,
                    tenant_name=names_of.get(tid, str(tid)),
                    priority=priority,
                    ready=n_ready,
                    due=n_due,
                )
            )
        return dict(out)

    async def _ready_pools(self, conn: AsyncConnection) -> list[str]:
        """The pools with runs in the ready queue: a skip scan of the ready index's
        leading column (one probe per pool), not a read of the queue."""
        first = sa.select(sa.func.min(runs.c.pool)).where(sa.text(READY)).scalar_subquery()
        found = sa.select(first.label("pool")).cte("found", recursive=True)
        after = (
            sa.select(sa.func.min(runs.c.pool))
            .where(sa.text(READY), runs.c.pool > found.c.pool)
            .scalar_subquery()
        )
        found = found.union_all(sa.select(after).where(found.c.pool.is_not(None)))
        rows = await conn.execute(sa.select(found.c.pool).where(found.c.pool.is_not(None)))
        return [r.pool for r in rows]
