"""Workers and leasing: registration, leasing a batch of ready runs, reservations.

Leasing a batch (the driver's ``attempts_lease``) picks the candidates under ``FOR
UPDATE SKIP LOCKED`` and starts each: DISPATCHED -> RUNNING, with a new attempt and a
new, strictly larger fencing token.

A worker leasing *ahead* also gets runs dispatched ahead of their instant, as
reservations: the run stays DISPATCHED, held for the worker under the attempt id and
token it will start with, and starts only when the worker confirms at its instant
(:meth:`LeasingMixin.attempts_start_many`). A cancel or pause before that wins, so
handing work out early never takes control away from the user; the instant itself
costs the worker one small request instead of a lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import NotFoundError, ValidationError, WorkerDeregisteredError
from cronwheel.domain.model import AttemptOutcome, LeasedAttempt, ReservationsStarted, Worker
from cronwheel.domain.states import RunState
from cronwheel.ids import new_id
from cronwheel.store.base import HeartbeatItem
from cronwheel.store.driver import WorkerGone
from cronwheel.store.notices import CHANNEL_RUNS_READY
from cronwheel.store.rows import worker_from
from cronwheel.store.schema import NO_RESERVATION, runs, workers
from cronwheel.store.sql.core import SqlCore

__all__ = ["LeasingMixin"]


class LeasingMixin(SqlCore):
    # -- workers -------------------------------------------------------------------

    async def workers_register(
        self,
        tenant_id: uuid.UUID | None,
        *,
        pool: str,
        capabilities: Sequence[str],
        tags: Sequence[str],
        capacity: int,
        name: str | None = None,
        webhooks_only: bool = False,
        now: datetime | None = None,
    ) -> Worker:
        if capacity < 1:
            raise ValidationError("capacity must be at least 1", field="capacity")
        async with self._write() as conn:
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    workers.insert()
                    .values(
                        id=new_id(),
                        tenant_id=tenant_id,
                        name=name,
                        pool=pool,
                        capabilities=sorted(set(capabilities)),
                        tags=sorted(set(tags)),
                        capacity=capacity,
                        webhooks_only=webhooks_only,
                        registered_at=at,
                        last_seen_at=at,
                    )
                    .returning(*workers.c)
                )
            ).one()
        return worker_from(row)

    async def workers_get(self, worker_id: uuid.UUID) -> Worker:
        async with self._read() as conn:
            row = (await conn.execute(workers.select().where(workers.c.id == worker_id))).first()
        if row is None:
            raise self._not_found("worker", worker_id)
        return worker_from(row)

    async def _worker_gone(
        self, conn: AsyncConnection, worker_id: uuid.UUID
    ) -> WorkerDeregisteredError | NotFoundError:
        """Why a worker found not live cannot lease: deregistered, or not there at all
        (only on that failure path: one read by primary key)."""
        row = (await conn.execute(sa.select(workers.c.id).where(workers.c.id == worker_id))).first()
        if row is None:
            return self._not_found("worker", worker_id)
        return WorkerDeregisteredError(
            f"worker {worker_id} was deregistered: it leases and starts nothing any more; "
            "register again for a new worker id"
        )

    # -- leasing -------------------------------------------------------------------

    async def attempts_lease(
        self,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool = False,
        ahead: float = 0.0,
        now: datetime | None = None,
    ) -> list[LeasedAttempt]:
        if max < 1:
            return []
        async with self._write() as conn:
            try:
                return await self.driver.attempts_lease(
                    conn, worker=worker, max=max, webhooks_only=webhooks_only, ahead=ahead, now=now
                )
            except WorkerGone as gone:
                raise await self._worker_gone(conn, gone.worker_id) from None

    # -- reservations ----------------------------------------------------------------

    async def attempts_start_many(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> ReservationsStarted:
        if not tokens:
            return ReservationsStarted(started_at=None)
        async with self._write() as conn:
            try:
                return await self.driver.attempts_start(
                    conn, worker_id=worker_id, tokens=tokens, tenant_id=tenant_id, now=now
                )
            except WorkerGone as gone:
                raise await self._worker_gone(conn, gone.worker_id) from None

    async def _unreserve(
        self,
        conn: AsyncConnection,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        *,
        worker_id: uuid.UUID | None = None,
    ) -> dict[tuple[uuid.UUID, int], AttemptOutcome]:
        """Release the reservations among ``items`` (of ``worker_id`` only, when given):
        the runs are free for any worker at once."""
        stmt = (
            sa.select(runs.c.id, runs.c.pool, runs.c.reserved_attempt, runs.c.reserved_token)
            .where(
                runs.c.reserved_token.in_([i.fencing_token for i in items]),
                runs.c.state == RunState.DISPATCHED.value,
            )
            .with_for_update()
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        if worker_id is not None:
            stmt = stmt.where(runs.c.reserved_by == worker_id)
        wanted = {(i.attempt_id, i.fencing_token) for i in items}
        rows = [
            r for r in await conn.execute(stmt) if (r.reserved_attempt, r.reserved_token) in wanted
        ]
        if not rows:
            return {}
        await conn.execute(
            runs.update()
            .where(self.driver.id_in(runs.c.id, [r.id for r in rows]))
            .values(**NO_RESERVATION)
        )
        await self._notify(conn, CHANNEL_RUNS_READY, sorted({r.pool for r in rows}))
        return {
            (r.reserved_attempt, r.reserved_token): AttemptOutcome(
                r.reserved_attempt, True, run_state=RunState.DISPATCHED
            )
            for r in rows
        }

    async def _reservations_of(
        self, conn: AsyncConnection, worker_id: uuid.UUID, tenant_id: uuid.UUID | None
    ) -> list[HeartbeatItem]:
        stmt = sa.select(runs.c.reserved_attempt, runs.c.reserved_token).where(
            runs.c.reserved_token.is_not(None),
            runs.c.state == RunState.DISPATCHED.value,
            runs.c.reserved_by == worker_id,
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        rows = await conn.execute(stmt)
        return [HeartbeatItem(r.reserved_attempt, r.reserved_token) for r in rows]
