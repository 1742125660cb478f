"""Workers and leasing: registration, leasing a batch of ready runs, reservations.

Leasing a batch picks the candidates under ``FOR UPDATE SKIP LOCKED`` on PostgreSQL,
then one UPDATE of runs (DISPATCHED -> RUNNING), one INSERT of attempts and one of
events; each leased run gets a new attempt and a new, strictly larger fencing token.

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
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import NotFoundError, ValidationError, WorkerDeregisteredError
from cronwheel.domain.model import AttemptOutcome, LeasedAttempt, ReservationsStarted, Worker
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.ids import new_id
from cronwheel.store.base import CHANNEL_RUNS_READY, HeartbeatItem
from cronwheel.store.schema import NO_RESERVATION, attempts, runs, workers
from cronwheel.store.sql.core import SqlCore, event_row, worker_from
from cronwheel.store.sql.progress import progress_deadline

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

    async def _worker_live(self, conn: AsyncConnection, worker_id: uuid.UUID) -> bool:
        """The worker exists and has not deregistered (its row locked against a
        deregistration until this transaction ends, where the database locks rows)."""
        stmt = (
            sa.select(workers.c.id)
            .where(workers.c.id == worker_id, workers.c.deregistered_at.is_(None))
            .with_for_update(read=True)
        )
        return (await conn.execute(stmt)).first() is not None

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
            at = await self._now(conn, now)
            # First, in the same write transaction: a deregistered worker leases nothing.
            # (Writes are serialised here, so a deregistration is wholly before or after.)
            seen = await conn.execute(
                workers.update()
                .where(workers.c.id == worker.id, workers.c.deregistered_at.is_(None))
                .values(last_seen_at=at)
            )
            if not seen.rowcount:
                raise await self._worker_gone(conn, worker.id)
            pick = (
                sa.select(*_LEASED_COLUMNS)
                .where(
                    runs.c.state == RunState.DISPATCHED.value,
                    runs.c.pool == worker.pool,
                    # fire_at is the run's not-before: dispatched ahead, it waits in the
                    # ready queue until then, or (within ``ahead`` of it) is reserved.
                    runs.c.fire_at <= at + timedelta(seconds=ahead),
                    runs.c.reserved_token.is_(None),  # reserved: not in the queue
                    self._json_subset(runs.c.requires, worker.capabilities),
                )
                .order_by(runs.c.priority, runs.c.fire_at)
                .limit(max)
                .with_for_update(skip_locked=True)
            )
            if worker.tenant_id is not None:
                pick = pick.where(runs.c.tenant_id == worker.tenant_id)
            if webhooks_only:  # a run has a task or a webhook, never both
                pick = pick.where(runs.c.task.is_(None))
            picked = (await conn.execute(pick)).all()
            due = [r for r in picked if r.fire_at <= at]
            later = [r for r in picked if r.fire_at > at]
            leased = await self._begin_attempts(
                conn,
                due,
                worker_id=worker.id,
                at=at,
                attempt_ids=[new_id() for _ in due],
                tokens=await self._fencing_tokens(conn, len(due)) if due else [],
            )
            leased += await self._reserve(conn, later, worker_id=worker.id)
        return sorted(leased, key=lambda a: (a.not_before is not None, a.not_before or at))

    async def _reserve(
        self, conn: AsyncConnection, rows: Sequence[Any], *, worker_id: uuid.UUID
    ) -> list[LeasedAttempt]:
        """Reserve ``rows`` (DISPATCHED, locked, due later) for the worker."""
        if not rows:
            return []
        tokens = await self._fencing_tokens(conn, len(rows))
        reserved = [
            LeasedAttempt(
                attempt_id=new_id(),
                run_id=r.id,
                tenant_id=r.tenant_id,
                job_id=r.job_id,
                number=r.attempt + 1,
                task=r.task,
                webhook=r.webhook,
                payload=r.payload,
                fencing_token=token,
                lease_expires_at=r.fire_at + timedelta(seconds=r.heartbeat_timeout),
                deadline=r.fire_at + timedelta(seconds=r.timeout),
                due_at=r.due_at,
                heartbeat_timeout=r.heartbeat_timeout,
                not_before=r.fire_at,
                progress_timeout=r.progress_timeout,
            )
            for r, token in zip(rows, tokens, strict=True)
        ]
        await self._update_each(
            conn,
            runs,
            [
                {
                    "id": a.run_id,
                    "reserved_by": worker_id,
                    "reserved_attempt": a.attempt_id,
                    "reserved_token": a.fencing_token,
                    "reserved_until": a.lease_expires_at,
                    "wait_reason": None,
                }
                for a in reserved
            ],
        )
        return reserved

    async def _begin_attempts(
        self,
        conn: AsyncConnection,
        rows: Sequence[Any],
        *,
        worker_id: uuid.UUID,
        at: datetime,
        attempt_ids: Sequence[uuid.UUID],
        tokens: Sequence[int],
    ) -> list[LeasedAttempt]:
        """Start ``rows`` (DISPATCHED, locked, due; as read before this): each becomes
        RUNNING with a new attempt (of ``attempt_ids`` and ``tokens``, in order), its
        reservation, if any, used up."""
        if not rows:
            return []
        await conn.execute(
            runs.update()
            .where(self._id_in(runs.c.id, [r.id for r in rows]))
            .values(
                state=RunState.RUNNING.value,
                attempt=runs.c.attempt + 1,
                started_at=sa.func.coalesce(runs.c.started_at, at),
                wait_reason=None,
                **NO_RESERVATION,
            )
        )
        leased: list[LeasedAttempt] = []
        attempt_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        for r, attempt_id, token in zip(rows, attempt_ids, tokens, strict=True):
            number = r.attempt + 1
            lease = at + timedelta(seconds=r.heartbeat_timeout)
            deadline = at + timedelta(seconds=r.timeout)
            attempt_rows.append(
                {
                    "id": attempt_id,
                    "tenant_id": r.tenant_id,
                    "run_id": r.id,
                    "number": number,
                    "worker_id": worker_id,
                    "fencing_token": token,
                    "state": AttemptState.RUNNING.value,
                    "lease_expires_at": lease,
                    "deadline": deadline,
                    "started_at": at,
                    "progress_deadline": progress_deadline(at, r.progress_timeout),
                }
            )
            event_rows.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    attempt_id=attempt_id,
                    from_state=RunState.DISPATCHED.value,
                    to_state=RunState.RUNNING.value,
                    actor=f"worker:{worker_id}",
                    data={"attempt": number, "fencing_token": token},
                )
            )
            leased.append(
                LeasedAttempt(
                    attempt_id=attempt_id,
                    run_id=r.id,
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    number=number,
                    task=r.task,
                    webhook=r.webhook,
                    payload=r.payload,
                    fencing_token=token,
                    lease_expires_at=lease,
                    deadline=deadline,
                    due_at=r.due_at,
                    heartbeat_timeout=r.heartbeat_timeout,
                    progress_timeout=r.progress_timeout,
                )
            )
        await conn.execute(attempts.insert(), attempt_rows)
        await self._insert_events(conn, event_rows)
        return leased

    # -- reservations ----------------------------------------------------------------

    def _reserved(self, tokens: Sequence[int], tenant_id: uuid.UUID | None) -> sa.Select[Any]:
        """The live reservations of ``tokens``, through the reservation index, locked."""
        stmt = (
            sa.select(*_LEASED_COLUMNS, runs.c.pool, runs.c.reserved_attempt, runs.c.reserved_token)
            .where(
                runs.c.reserved_token.in_(list(tokens)),
                runs.c.state == RunState.DISPATCHED.value,
            )
            .with_for_update()
        )
        return stmt if tenant_id is None else stmt.where(runs.c.tenant_id == tenant_id)

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
            at = await self._now(conn, now)
            if not await self._worker_live(conn, worker_id):
                raise await self._worker_gone(conn, worker_id)
            rows = (
                await conn.execute(
                    self._reserved(tokens, tenant_id).where(runs.c.reserved_by == worker_id)
                )
            ).all()
            due = [r for r in rows if r.fire_at <= at]
            await self._begin_attempts(
                conn,
                due,
                worker_id=worker_id,
                at=at,
                attempt_ids=[r.reserved_attempt for r in due],
                tokens=[r.reserved_token for r in due],
            )
        found = {r.reserved_token for r in rows}
        return ReservationsStarted(
            started_at=at if due else None,
            started=[r.reserved_token for r in due],
            not_yet=[r.reserved_token for r in rows if r.fire_at > at],
            refused=[t for t in tokens if t not in found],
            first_tries_due=[r.due_at for r in due if r.attempt == 0],
        )

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
        stmt = self._reserved([i.fencing_token for i in items], tenant_id)
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
            .where(self._id_in(runs.c.id, [r.id for r in rows]))
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


_LEASED_COLUMNS = (
    runs.c.id,
    runs.c.tenant_id,
    runs.c.job_id,
    runs.c.attempt,
    runs.c.task,
    runs.c.webhook,
    runs.c.payload,
    runs.c.timeout,
    runs.c.heartbeat_timeout,
    runs.c.progress_timeout,
    runs.c.due_at,
    runs.c.priority,
    runs.c.fire_at,
)
