"""The scheduler's side of the store: shard leases, the due-window scan, firing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import DueRun, FiredRun
from cronwheel.domain.states import RunState
from cronwheel.store.base import CHANNEL_RUNS_READY, LeaseRenewal, ready_notices
from cronwheel.store.schema import NO_RESERVATION, events, jobs, runs, scheduler_nodes, shard_leases
from cronwheel.store.sql.firing import FiringMixin

__all__ = ["DispatchMixin"]


class DispatchMixin(FiringMixin):
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
                self._id_in(runs.c.shard, list(shards)),
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
            fired = await self._fire_plain(
                conn, run_ids, node_id=node_id, at=at, lead=lead, epochs=epochs
            )
            if len(fired) < len(run_ids):
                # The rest: first tries of recurring jobs' scheduled runs (their policies
                # apply), or runs no longer firable (cancelled, not ours, not yet due).
                candidates = await self._fire_candidates(
                    conn, run_ids, node_id=node_id, at=at, lead=lead, epochs=epochs
                )
                if candidates:
                    fired += await self._fire_scheduled(conn, candidates, at=at, node_id=node_id)
        return fired

    async def _fire_candidates(
        self,
        conn: AsyncConnection,
        run_ids: Sequence[uuid.UUID],
        *,
        node_id: str,
        at: datetime,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> Sequence[Any]:
        """The runs of ``run_ids`` whose firing applies their job's policies — first
        tries of recurring jobs' scheduled runs, due, on a shard ``node_id`` holds —
        locked, with their job's state and schedule (skipping runs locked elsewhere)."""
        return (
            await conn.execute(
                sa.select(
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.job_name,
                    runs.c.shard,
                    runs.c.due_at,
                    runs.c.fire_at,
                    runs.c.pool,
                    jobs.c.state.label("job_state"),
                    jobs.c.schedule,
                )
                .join(jobs, jobs.c.id == runs.c.job_id)
                .where(
                    self._id_in(runs.c.id, list(run_ids)),
                    runs.c.state == RunState.SCHEDULED.value,
                    runs.c.origin == "schedule",
                    runs.c.attempt == 0,
                    runs.c.fire_at <= at + timedelta(seconds=lead),
                    self._shard_held(runs.c.shard, node_id=node_id, at=at, epochs=epochs),
                )
                .with_for_update(of=runs, skip_locked=True)
            )
        ).all()

    async def _fire_plain(
        self,
        conn: AsyncConnection,
        run_ids: Sequence[uuid.UUID],
        *,
        node_id: str,
        at: datetime,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> list[FiredRun]:
        """Dispatch the runs of ``run_ids`` that need no policy (one-off runs, retries,
        triggered, replayed and backfilled ones): one UPDATE, one INSERT of events."""
        # The epoch fence: only the live owner of a run's shard may fire it. A node that
        # lost its lease (paused, partitioned) matches nothing here.
        held = self._shard_held(runs.c.shard, node_id=node_id, at=at, epochs=epochs)
        rows = (
            await conn.execute(
                runs.update()
                .where(
                    self._id_in(runs.c.id, list(run_ids)),
                    runs.c.state == RunState.SCHEDULED.value,
                    runs.c.fire_at <= at + timedelta(seconds=lead),
                    sa.or_(runs.c.origin != "schedule", runs.c.attempt > 0),
                    held,
                )
                .values(state=RunState.DISPATCHED.value, dispatched_at=at, **NO_RESERVATION)
                .returning(
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.pool,
                    runs.c.fire_at,
                    runs.c.dispatched_at,
                )
            )
        ).all()
        if rows:
            await conn.execute(
                events.insert(),
                [
                    {
                        "tenant_id": r.tenant_id,
                        "at": at,
                        "kind": "run.transition",
                        "job_id": r.job_id,
                        "run_id": r.id,
                        "attempt_id": None,
                        "from_state": RunState.SCHEDULED.value,
                        "to_state": RunState.DISPATCHED.value,
                        "actor": node_id,
                        "reason": _lateness_reason(r.fire_at, at),
                        "data": None,
                    }
                    for r in rows
                ],
            )
            await self._notify(
                conn, CHANNEL_RUNS_READY, ready_notices(((r.pool, r.fire_at) for r in rows), at)
            )
        return [
            FiredRun(
                id=r.id,
                tenant_id=r.tenant_id,
                pool=r.pool,
                fire_at=r.fire_at,
                dispatched_at=r.dispatched_at,
            )
            for r in rows
        ]

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
            expires = at + timedelta(seconds=ttl)
            wanted = list(shards)
            if wanted:
                existing = {
                    r.shard
                    for r in await conn.execute(
                        sa.select(shard_leases.c.shard).where(
                            self._id_in(shard_leases.c.shard, wanted)
                        )
                    )
                }
                missing = [s for s in wanted if s not in existing]
                if missing:
                    await self._insert_shards(conn, missing)
                # Renew our own leases: the epoch stays.
                await conn.execute(
                    shard_leases.update()
                    .where(
                        self._id_in(shard_leases.c.shard, wanted),
                        shard_leases.c.owner == node_id,
                        shard_leases.c.expires_at > at,
                    )
                    .values(expires_at=expires)
                )
                # Up to the limit: expired leases first (their owner died or stalled:
                # failover comes first), then free ones (never owned, or handed back), in
                # shard order; SKIP LOCKED: nodes taking at once never wait. A change of
                # owner bumps the epoch.
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
                            self._id_in(shard_leases.c.shard, wanted),
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
                            .where(self._id_in(shard_leases.c.shard, picked))
                            .values(
                                owner=node_id, expires_at=expires, epoch=shard_leases.c.epoch + 1
                            )
                        )
            held = await conn.execute(
                sa.select(shard_leases.c.shard, shard_leases.c.epoch).where(
                    shard_leases.c.owner == node_id, shard_leases.c.expires_at > at
                )
            )
            return {r.shard: r.epoch for r in held}

    async def _insert_shards(self, conn: Any, shards: list[int]) -> None:
        """Create lease rows; a concurrent creator wins harmlessly."""
        await conn.execute(
            self._insert_ignore(
                shard_leases,
                [{"shard": s, "owner": None, "epoch": 0, "expires_at": None} for s in shards],
            )
        )

    async def scheduler_renew(
        self, *, node_id: str, ttl: float, shards: int, now: datetime | None = None
    ) -> LeaseRenewal:
        live = await self.scheduler_nodes_beat(node_id=node_id, ttl=ttl, now=now)
        share = -(-shards // max(1, live))
        held = await self.shard_leases_acquire(
            node_id=node_id, shards=range(shards), ttl=ttl, limit=share, now=now
        )
        others = await self.shard_leases_next_expiry(node_id=node_id, now=now)
        return LeaseRenewal(live=live, share=share, held=held, others_expire_at=others)

    async def scheduler_nodes_beat(
        self, *, node_id: str, ttl: float, now: datetime | None = None
    ) -> int:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await conn.execute(
                scheduler_nodes.delete().where(
                    scheduler_nodes.c.heartbeat_at < at - timedelta(seconds=ttl)
                )
            )
            updated = await conn.execute(
                scheduler_nodes.update()
                .where(scheduler_nodes.c.node_id == node_id)
                .values(heartbeat_at=at)
            )
            if updated.rowcount == 0:
                await conn.execute(
                    self._insert_ignore(
                        scheduler_nodes,
                        [{"node_id": node_id, "started_at": at, "heartbeat_at": at}],
                    )
                )
            return int(
                (
                    await conn.execute(sa.select(sa.func.count()).select_from(scheduler_nodes))
                ).scalar_one()
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
                    self._id_in(shard_leases.c.shard, list(shards)), shard_leases.c.owner == node_id
                )
                .values(owner=None, expires_at=None)
            )

    async def shard_leases_next_expiry(
        self, *, node_id: str, now: datetime | None = None
    ) -> datetime | None:
        async with self._read() as conn:
            at = await self._statement_now(conn, now)
            expiry: datetime | None = (
                await conn.execute(
                    sa.select(sa.func.min(shard_leases.c.expires_at)).where(
                        shard_leases.c.owner.is_not(None),
                        shard_leases.c.owner != node_id,
                        shard_leases.c.expires_at > at,
                    )
                )
            ).scalar()
        return expiry

    async def shard_leases_list(self) -> list[dict[str, Any]]:
        async with self._read() as conn:
            rows = await conn.execute(shard_leases.select().order_by(shard_leases.c.shard))
            return [dict(r._mapping) for r in rows]


def _lateness_reason(fire_at: datetime, at: datetime) -> str | None:
    """Say why a run went out late, when it did by more than a second."""
    late = (at - fire_at).total_seconds()
    if late <= 1.0:
        return None
    return f"dispatched {late:.1f} s after its due time (scheduler catching up)"
