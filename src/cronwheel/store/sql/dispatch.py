"""The scheduler's side of the store: shard leases, the due-window scan, firing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.model import DueRun, FiredRun
from cronwheel.domain.states import RunState
from cronwheel.store.base import LeaseRenewal
from cronwheel.store.schema import runs, scheduler_nodes, shard_leases
from cronwheel.store.sql.firing import FiringMixin
from cronwheel.store.sql.statements import shard_leases_take

__all__ = ["DispatchMixin"]


class DispatchMixin(FiringMixin):
    _seeded_shards = 0

    async def runs_due_scan(
        self,
        *,
        shards: Sequence[int],
        until: datetime,
        limit: int = 10_000,
        since: datetime | None = None,
    ) -> list[DueRun]:
        if not shards:
            return []
        stmt = (
            sa.select(runs.c.id, runs.c.shard, runs.c.fire_at)
            .where(
                runs.c.state == RunState.SCHEDULED.value,
                self.driver.id_in(runs.c.shard, list(shards)),
                runs.c.fire_at < until,
            )
            .order_by(runs.c.fire_at)
            .limit(limit)
        )
        if since is not None:
            stmt = stmt.where(runs.c.fire_at >= since)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [DueRun(id=r.id, shard=r.shard, fire_at=r.fire_at) for r in rows]

    async def runs_fire(
        self,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        now: datetime | None = None,
        lead: float = 0.0,
        epochs: Mapping[int, int] | None = None,
    ) -> list[FiredRun]:
        if not run_ids:
            return []
        async with self._write() as conn:
            at = await self._now(conn, now)
            fired = await self.driver.runs_fire(
                conn, run_ids=run_ids, node_id=node_id, at=at, lead=lead, epochs=epochs
            )
            if len(fired) < len(run_ids):
                # The rest: first tries of recurring jobs' scheduled runs (their policies
                # apply), or runs no longer firable (cancelled, not ours, not yet due).
                candidates = await self.driver.runs_fire_candidates(
                    conn, run_ids=run_ids, node_id=node_id, at=at, lead=lead, epochs=epochs
                )
                if candidates:
                    fired += await self._fire_scheduled(conn, candidates, at=at, node_id=node_id)
        return fired

    async def shard_leases_acquire(
        self,
        *,
        node_id: str,
        shards: Sequence[int],
        ttl: float,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> dict[int, int]:
        async with self._write() as conn:
            at = await self._now(conn, now)
            return await shard_leases_take(
                conn, self.driver, node_id=node_id, shards=shards, ttl=ttl, limit=limit, at=at
            )

    async def scheduler_renew(
        self, *, node_id: str, ttl: float, shards: int, now: datetime | None = None
    ) -> LeaseRenewal:
        if self._seeded_shards < shards:
            # The lease rows, once per store: renewals only update rows.
            async with self._write() as conn:
                await conn.execute(
                    self.driver.insert_ignore(
                        shard_leases,
                        [
                            {"shard": s, "owner": None, "epoch": 0, "expires_at": None}
                            for s in range(shards)
                        ],
                    )
                )
            self._seeded_shards = shards
        async with self._transaction(self.driver.begin_renewal) as conn:
            return await self.driver.shard_leases_renew(
                conn, node_id=node_id, ttl=ttl, shards=shards, now=now
            )

    async def scheduler_nodes_leave(self, *, node_id: str) -> None:
        async with self._write() as conn:
            await conn.execute(scheduler_nodes.delete().where(scheduler_nodes.c.node_id == node_id))

    async def shard_leases_release(self, *, node_id: str, shards: Sequence[int]) -> None:
        if not shards:
            return
        async with self._write() as conn:
            await conn.execute(
                shard_leases.update()
                .where(
                    self.driver.id_in(shard_leases.c.shard, list(shards)),
                    shard_leases.c.owner == node_id,
                )
                .values(owner=None, expires_at=None)
            )

    async def shard_leases_list(self) -> list[dict[str, Any]]:
        async with self._read() as conn:
            rows = await conn.execute(shard_leases.select().order_by(shard_leases.c.shard))
            return [dict(r._mapping) for r in rows]
