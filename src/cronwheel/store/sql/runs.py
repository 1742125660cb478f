"""Runs, one due occurrence each: reading and listing them, cancelling one, counting
them by state, and the scheduler's scan of its shards' due window."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import IllegalTransitionError
from cronwheel.domain.model import DueRun, Page, Run
from cronwheel.domain.states import ACTIVE_STATES, RunState
from cronwheel.store.rows import (
    run_from,
    uuid_cursor,
)
from cronwheel.store.schema import (
    runs,
)
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import RunFilter

__all__ = ["RunsMixin"]


class RunsMixin(SqlCore):
    async def runs_get(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run:
        async with self._read() as conn:
            row = (
                await conn.execute(
                    sa.select(*runs.c).where(runs.c.tenant_id == tenant_id, runs.c.id == run_id)
                )
            ).first()
        if row is None:
            raise self._not_found("run", run_id)
        return run_from(row)

    async def runs_list(
        self,
        tenant_id: uuid.UUID,
        *,
        filter: RunFilter | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Run]:
        before = uuid_cursor(cursor)
        f = filter or RunFilter()
        stmt = sa.select(*runs.c).where(runs.c.tenant_id == tenant_id)
        if f.job_id is not None:
            stmt = stmt.where(runs.c.job_id == f.job_id)
        if f.states:
            stmt = stmt.where(runs.c.state.in_(list(f.states)))
        if f.since is not None:
            stmt = stmt.where(runs.c.due_at >= f.since)
        if f.until is not None:
            stmt = stmt.where(runs.c.due_at < f.until)
        if f.tag is not None:
            stmt = stmt.where(self.driver.json_has(runs.c.tags, f.tag))
        if before is not None:
            stmt = stmt.where(runs.c.id < before)
        stmt = stmt.order_by(runs.c.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [run_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def runs_cancel(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Run:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._lock_live_runs(conn, tenant_id, runs.c.id == run_id)
            current = (
                await conn.execute(
                    sa.select(runs.c.state).where(
                        runs.c.tenant_id == tenant_id, runs.c.id == run_id
                    )
                )
            ).first()
            if current is None:
                raise self._not_found("run", run_id)
            if RunState(current.state) not in ACTIVE_STATES:
                raise IllegalTransitionError(
                    f"run {run_id} is {current.state} and cannot be cancelled",
                    source=current.state,
                    target=RunState.CANCELLED.value,
                )
            rows = await self._cancel_runs(
                conn,
                tenant_id,
                runs.c.id == run_id,
                at=at,
                actor=name_of(actor),
                reason=reason or "cancelled by request",
            )
            await self._insert_events(conn, rows)
            row = (await conn.execute(sa.select(*runs.c).where(runs.c.id == run_id))).one()
            # A running run is asked to stop: it stays RUNNING until its handler ends.
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="run.cancel",
                target_kind="run",
                target_id=run_id,
                reason=reason,
                before={"state": current.state},
                after={"state": row.state, "cancel_requested": row.cancel_requested},
            )
        return run_from(row)

    async def runs_count_by_state(self) -> dict[str, int]:
        async with self._read() as conn:
            rows = (
                await conn.execute(sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state))
            ).all()
        counts = {s.value: 0 for s in RunState}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    async def runs_due_scan(
        self,
        *,
        shards: Sequence[int],
        until: datetime,
        limit: int = 10_000,
        since: datetime | None = None,
        after_id: uuid.UUID | None = None,
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
            .order_by(runs.c.fire_at, runs.c.id)
            .limit(limit)
        )
        if since is not None and after_id is not None:
            stmt = stmt.where(
                sa.or_(
                    runs.c.fire_at > since,
                    sa.and_(runs.c.fire_at == since, runs.c.id > after_id),
                )
            )
        elif since is not None:
            stmt = stmt.where(runs.c.fire_at >= since)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [DueRun(id=r.id, shard=r.shard, fire_at=r.fire_at) for r in rows]
