"""Workers and leasing: registration, and leasing a batch of ready runs.

Leasing a batch is one UPDATE of runs (DISPATCHED -> RUNNING) with the candidates
picked under ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, then one INSERT of attempts and
one of events; each leased run gets a new attempt and a new, strictly larger fencing
token.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import LeasedAttempt, Worker
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.ids import new_id
from cronwheel.store.schema import attempts, runs, workers
from cronwheel.store.sql.core import SqlCore, event_row, worker_from

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

    # -- leasing -------------------------------------------------------------------

    async def attempts_lease(
        self,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool = False,
        now: datetime | None = None,
    ) -> list[LeasedAttempt]:
        if max < 1:
            return []
        async with self._write() as conn:
            at = await self._now(conn, now)
            pick = (
                sa.select(runs.c.id)
                .where(
                    runs.c.state == RunState.DISPATCHED.value,
                    runs.c.pool == worker.pool,
                    runs.c.fire_at <= at,  # its not-before: dispatched ahead, it waits
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
            rows = (
                await conn.execute(
                    runs.update()
                    .where(
                        runs.c.id.in_(pick.scalar_subquery()),
                        runs.c.state == RunState.DISPATCHED.value,
                    )
                    .values(
                        state=RunState.RUNNING.value,
                        attempt=runs.c.attempt + 1,
                        started_at=sa.func.coalesce(runs.c.started_at, at),
                        wait_reason=None,
                    )
                    .returning(
                        runs.c.id,
                        runs.c.tenant_id,
                        runs.c.job_id,
                        runs.c.attempt,
                        runs.c.task,
                        runs.c.webhook,
                        runs.c.payload,
                        runs.c.timeout,
                        runs.c.heartbeat_timeout,
                        runs.c.due_at,
                        runs.c.priority,
                        runs.c.fire_at,
                    )
                )
            ).all()
            if not rows:
                await conn.execute(
                    workers.update().where(workers.c.id == worker.id).values(last_seen_at=at)
                )
                return []
            rows = sorted(rows, key=lambda r: (r.priority, r.fire_at))
            tokens = await self._fencing_tokens(conn, len(rows))
            leased: list[LeasedAttempt] = []
            attempt_rows: list[dict[str, Any]] = []
            event_rows: list[dict[str, Any]] = []
            for r, token in zip(rows, tokens, strict=True):
                attempt_id = new_id()
                lease = at + timedelta(seconds=r.heartbeat_timeout)
                deadline = at + timedelta(seconds=r.timeout)
                attempt_rows.append(
                    {
                        "id": attempt_id,
                        "tenant_id": r.tenant_id,
                        "run_id": r.id,
                        "number": r.attempt,
                        "worker_id": worker.id,
                        "fencing_token": token,
                        "state": AttemptState.RUNNING.value,
                        "lease_expires_at": lease,
                        "deadline": deadline,
                        "started_at": at,
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
                        actor=f"worker:{worker.id}",
                        data={"attempt": r.attempt, "fencing_token": token},
                    )
                )
                leased.append(
                    LeasedAttempt(
                        attempt_id=attempt_id,
                        run_id=r.id,
                        tenant_id=r.tenant_id,
                        job_id=r.job_id,
                        number=r.attempt,
                        task=r.task,
                        webhook=r.webhook,
                        payload=r.payload,
                        fencing_token=token,
                        lease_expires_at=lease,
                        deadline=deadline,
                        due_at=r.due_at,
                        heartbeat_timeout=r.heartbeat_timeout,
                    )
                )
            await conn.execute(attempts.insert(), attempt_rows)
            await self._insert_events(conn, event_rows)
            await conn.execute(
                workers.update().where(workers.c.id == worker.id).values(last_seen_at=at)
            )
        return leased
