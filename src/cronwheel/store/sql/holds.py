"""Pausing and resuming jobs, any number at once: what one pause (``jobs_pause``) and a
bulk pause (``store/sql/bulk.py``) both do, with one statement per step for all the
jobs, never one per job.

::

    pause   ACTIVE ─▶ PAUSED   its SCHEDULED runs parked (fire_at = PARKED_FIRE_AT),
                               its DISPATCHED ones taken back and parked (PARK)
    resume  PAUSED ─▶ ACTIVE   its parked runs due again at their due instants (spread
                               as the job says), announced to the schedulers

A parked run keeps its due instant; ``fire_at >= PARKED_FIRE_AT`` is exactly "parked".
The jobs' live runs are locked first, in id order, as every path that changes runs and
their jobs does (``SqlCore._lock_jobs_with_runs``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.states import PARK, JobState, RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import event_row
from cronwheel.store.schema import PARKED_FIRE_AT, jobs, runs
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.statements import PAUSED_REASON, update_each
from cronwheel.timing.spread import spread_instant

__all__ = ["RESUMED_REASON", "HoldsMixin"]

RESUMED_REASON = "resumed after pause"


class HoldsMixin(SqlCore):
    async def _jobs_move(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_ids: Sequence[uuid.UUID],
        source: JobState,
        target: JobState,
        at: datetime,
    ) -> list[uuid.UUID]:
        """Move those of ``job_ids`` that are ``source`` to ``target`` (their live runs
        locked first): the ones moved, in id order."""
        if not job_ids:
            return []
        # The jobs in id order too: an UPDATE of many takes them in whatever order its
        # plan reads them, and a redrive of their runs locks them in id order.
        await self._lock_jobs_with_runs(conn, tenant_id, job_ids)
        moved = await conn.execute(
            jobs.update()
            .where(
                jobs.c.tenant_id == tenant_id,
                self.driver.id_in(jobs.c.id, list(job_ids)),
                jobs.c.state == source.value,
            )
            .values(state=target.value, updated_at=at, version=jobs.c.version + 1)
            .returning(jobs.c.id)
        )
        return sorted(r.id for r in moved)

    async def _jobs_flip(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_ids: Sequence[uuid.UUID],
        *,
        pause: bool,
        at: datetime,
        by: str | None,
    ) -> list[dict[str, Any]]:
        """The runs of ``job_ids`` (just paused, or resumed) held, or released and
        announced: the events of the runs moved."""
        if pause:
            return await self._jobs_hold(conn, tenant_id, job_ids, at=at, by=by)
        events, notices = await self._jobs_release(conn, tenant_id, job_ids, at=at, by=by)
        if notices:
            await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        return events

    async def _jobs_hold(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_ids: Sequence[uuid.UUID],
        *,
        at: datetime,
        by: str | None,
    ) -> list[dict[str, Any]]:
        """Park the runs of ``job_ids`` (just paused): the events of the runs moved."""
        out: list[dict[str, Any]] = []
        if not job_ids:
            return out
        # SCHEDULED runs are parked in place, first: the DISPATCHED runs moved back next
        # (PARK) must not be counted twice.
        for source, kind in ((RunState.SCHEDULED, "run.parked"), (PARK.source, "run.transition")):
            moved = await conn.execute(
                runs.update()
                .where(
                    runs.c.tenant_id == tenant_id,
                    self.driver.id_in(runs.c.job_id, list(job_ids)),
                    runs.c.state == source.value,
                    runs.c.fire_at < PARKED_FIRE_AT,
                )
                .values(
                    state=RunState.SCHEDULED.value,
                    fire_at=PARKED_FIRE_AT,
                    dispatched_at=None,
                    reason=PAUSED_REASON,
                )
                .returning(runs.c.id, runs.c.job_id)
            )
            out += [
                event_row(
                    at=at,
                    kind=kind,
                    tenant_id=tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=source.value,
                    to_state=RunState.SCHEDULED.value,
                    actor=by,
                    reason=PAUSED_REASON,
                )
                for r in moved
            ]
        # A paused workflow's waiting nodes are reserved ahead of their gate no more (a
        # gate opening under the pause parks them). Passed over when another transaction
        # holds them (advancing their workflow run): never waited for here.
        armed = (
            sa.select(runs.c.id)
            .where(
                runs.c.tenant_id == tenant_id,
                self.driver.id_in(runs.c.job_id, list(job_ids)),
                runs.c.state == RunState.PENDING.value,
                runs.c.gated_at.is_not(None),
            )
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        await conn.execute(runs.update().where(runs.c.id.in_(armed)).values(gated_at=None))
        return out

    async def _jobs_release(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_ids: Sequence[uuid.UUID],
        *,
        at: datetime,
        by: str | None,
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Release the parked runs of ``job_ids`` (just resumed): their events, and the
        notices of those due within the schedulers' horizon (to send after commit)."""
        if not job_ids:
            return [], []
        released = (
            await conn.execute(
                runs.update()
                .where(
                    runs.c.tenant_id == tenant_id,
                    self.driver.id_in(runs.c.job_id, list(job_ids)),
                    runs.c.state == RunState.SCHEDULED.value,
                    runs.c.fire_at >= PARKED_FIRE_AT,
                )
                .values(fire_at=runs.c.due_at, reason=RESUMED_REASON)
                .returning(runs.c.id, runs.c.job_id, runs.c.shard, runs.c.due_at)
            )
        ).all()
        fires = await self._spread_released(conn, tenant_id, released)
        events = [
            event_row(
                at=at,
                kind="run.unparked",
                tenant_id=tenant_id,
                job_id=r.job_id,
                run_id=r.id,
                from_state=RunState.SCHEDULED.value,
                to_state=RunState.SCHEDULED.value,
                actor=by,
                reason=RESUMED_REASON,
            )
            for r in released
        ]
        notices = [
            announce(r.id, r.shard, fires[r.id])
            for r in released
            if fires[r.id] < at + ANNOUNCE_HORIZON
        ]
        return events, notices

    async def _spread_released(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, released: Sequence[Any]
    ) -> dict[uuid.UUID, datetime]:
        """The fire times of runs a resume released (``id``, ``job_id``, ``due_at``):
        their spread instants, written over the due instants the release set, for the
        jobs that spread."""
        fires = {r.id: r.due_at for r in released}
        if not released:
            return fires
        templates = await conn.execute(
            sa.select(jobs.c.id, jobs.c.template).where(
                jobs.c.tenant_id == tenant_id,
                self.driver.id_in(jobs.c.id, sorted({r.job_id for r in released})),
            )
        )
        spreads = {r.id: RunTemplate.from_json(r.template).spread for r in templates}
        spread = {
            r.id: spread_instant(r.job_id, r.due_at, spreads[r.job_id])
            for r in released
            if spreads.get(r.job_id, 0) > 0
        }
        if spread:
            await update_each(conn, runs, [{"id": i, "fire_at": f} for i, f in spread.items()])
            fires.update(spread)
        return fires
