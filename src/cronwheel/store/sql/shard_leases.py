"""Shard leases and scheduler nodes: a node's renewal (its beat, its leases, its fair
share, in the driver's ``shard_leases_renew``), taking given shards, handing them back."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronwheel.store.schema import scheduler_nodes, shard_leases
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.statements import free_shard_leases, shard_leases_take
from cronwheel.store.values import LeaseRenewal

__all__ = ["ShardLeasesMixin"]


class ShardLeasesMixin(SqlCore):
    _seeded_shards = 0

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
                        free_shard_leases(range(shards)),
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
