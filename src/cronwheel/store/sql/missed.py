"""Missed runs and stalled schedules (docs/alerts.md).

A run is *missed* when it is still SCHEDULED past its fire time plus its job's lateness
budget (``lateness_budget`` in the job's template, 30 s by default)::

    SCHEDULED, fire_at + budget < now, not marked ──mark──▶ missed_at = now
                                                            event run.missed

It stays missed while SCHEDULED with ``missed_at >= fire_at``: firing, cancelling or
pausing it (a paused job's runs are parked far ahead) ends it, and a retry's later fire
time is a new stint that may be missed again. The scheduler node marks the runs of its
own shards: candidates come from the due index (``ix_runs_due``: one range per shard,
``fire_at`` before now less the smallest budget), oldest first, a bounded batch at a
time, locked with SKIP LOCKED so that firing never waits on it.

A recurring job's schedule is *stalled* when the job is active and its latest
scheduled run (by due instant) is no longer SCHEDULED — nothing is left to fire its
next occurrence — and that occurrence is past the budget. Whether it is stalled is
computed in Python from the job's schedule (:func:`cronwheel.timing.next_after`); the
store reads the jobs (``ix_jobs_recurring``, a batch at a time by id, plus the stalled
ones, ``ix_jobs_stalled``) with each one's latest run (one probe of the unique index
on ``(tenant_id, job_id, due_at)``), and marks or clears ``jobs.schedule_stalled_at``
with the events ``job.schedule_stalled`` and ``job.schedule_resumed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.model import MissedRun, ScheduleProbe, StalledJob
from cronwheel.domain.spec import LATENESS_BUDGET_DEFAULT
from cronwheel.domain.states import JobState, RunState
from cronwheel.store.rows import event_row
from cronwheel.store.schema import NUM_SHARDS, RECURRING, jobs, runs, tenants
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.observed import tenant_names_of

__all__ = ["MIN_BUDGET", "MissedMixin", "missed_now"]

# The smallest lateness budget a job may set: what bounds the due index's range.
MIN_BUDGET = timedelta(seconds=1)
_ALL_SHARDS = list(range(NUM_SHARDS))


def _budget() -> sa.ColumnElement[float]:
    """A run's lateness budget: its job's, or the default for jobs stored before it."""
    return sa.func.coalesce(
        jobs.c.template["lateness_budget"].as_float(), sa.literal(LATENESS_BUDGET_DEFAULT)
    )


def missed_now() -> sa.ColumnElement[bool]:
    """A run missed in its current stint (the marked runs still SCHEDULED)."""
    return sa.and_(
        runs.c.state == RunState.SCHEDULED.value,
        runs.c.missed_at.is_not(None),
        runs.c.missed_at >= runs.c.fire_at,
    )


def _unmarked() -> sa.ColumnElement[bool]:
    return sa.or_(runs.c.missed_at.is_(None), runs.c.missed_at < runs.c.fire_at)


class MissedMixin(SqlCore):
    # -- missed runs -----------------------------------------------------------------

    def _missed_candidates(self, shards: Sequence[int], at: datetime, limit: int) -> sa.Select[Any]:
        return (
            sa.select(runs.c.id)
            .select_from(
                runs.join(
                    jobs, sa.and_(jobs.c.tenant_id == runs.c.tenant_id, jobs.c.id == runs.c.job_id)
                )
            )
            .where(
                runs.c.state == RunState.SCHEDULED.value,
                runs.c.shard.in_(sorted(shards)),
                runs.c.fire_at < at - MIN_BUDGET,
                _unmarked(),
                self.driver.late_past(runs.c.fire_at, _budget(), at),
            )
            .order_by(runs.c.fire_at, runs.c.id)
            .limit(limit)
        )

    async def runs_missed_candidates(
        self, *, shards: Sequence[int], now: datetime | None = None, limit: int = 1000
    ) -> list[uuid.UUID]:
        if not shards:
            return []
        async with self._read() as conn:
            at = await self._now(conn, now)
            rows = (await conn.execute(self._missed_candidates(shards, at, limit))).all()
        return [r.id for r in rows]

    async def runs_mark_missed(
        self,
        *,
        shards: Sequence[int],
        run_ids: Sequence[uuid.UUID] | None = None,
        actor: str | None = None,
        now: datetime | None = None,
        limit: int = 1000,
    ) -> list[MissedRun]:
        if not shards or (run_ids is not None and not run_ids):
            return []
        async with self._write() as conn:
            at = await self._now(conn, now)
            found = self._missed_candidates(shards, at, limit)
            if run_ids is not None:
                found = found.where(self.driver.id_in(runs.c.id, list(run_ids)))
            # Firing holds the rows it fires: those are not missed, and never waited on.
            locked = (await conn.execute(found.with_for_update(of=runs, skip_locked=True))).all()
            if not locked:
                return []
            ids = [r.id for r in locked]
            marked = (
                await conn.execute(
                    runs.update()
                    .where(self.driver.id_in(runs.c.id, ids))
                    .values(missed_at=at)
                    .returning(
                        runs.c.id,
                        runs.c.tenant_id,
                        runs.c.job_id,
                        runs.c.job_name,
                        runs.c.pool,
                        runs.c.priority,
                        runs.c.fire_at,
                    )
                )
            ).all()
            names = await tenant_names_of(conn, {r.tenant_id for r in marked})
            missed = sorted(
                (
                    MissedRun(
                        run_id=r.id,
                        tenant_id=r.tenant_id,
                        tenant_name=names.get(r.tenant_id, ""),
                        job_id=r.job_id,
                        job_name=r.job_name,
                        pool=r.pool,
                        priority=r.priority,
                        fire_at=r.fire_at,
                        missed_at=at,
                    )
                    for r in marked
                ),
                key=lambda m: (m.fire_at, m.run_id),
            )
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="run.missed",
                        tenant_id=m.tenant_id,
                        job_id=m.job_id,
                        run_id=m.run_id,
                        actor=actor,
                        reason=_late(m.fire_at, at),
                        data={"fire_at": m.fire_at.isoformat(), "pool": m.pool},
                    )
                    for m in missed
                ],
            )
        return missed

    async def runs_missed(
        self, tenant_id: uuid.UUID | None, *, now: datetime | None = None, limit: int = 1000
    ) -> list[MissedRun]:
        """Runs missed now, oldest fire time first: through the due index, every shard's
        range up to now (a missed run is past its fire time)."""
        async with self._read() as conn:
            at = await self._now(conn, now)
            stmt = (
                sa.select(
                    runs.c.id,
                    runs.c.tenant_id,
                    tenants.c.name.label("tenant_name"),
                    runs.c.job_id,
                    runs.c.job_name,
                    runs.c.pool,
                    runs.c.priority,
                    runs.c.fire_at,
                    runs.c.missed_at,
                )
                .select_from(runs.join(tenants, tenants.c.id == runs.c.tenant_id))
                .where(runs.c.shard.in_(_ALL_SHARDS), runs.c.fire_at < at, missed_now())
                .order_by(runs.c.fire_at, runs.c.id)
                .limit(limit)
            )
            if tenant_id is not None:
                stmt = stmt.where(runs.c.tenant_id == tenant_id)
            rows = (await conn.execute(stmt)).all()
        return [
            MissedRun(
                run_id=r.id,
                tenant_id=r.tenant_id,
                tenant_name=r.tenant_name,
                job_id=r.job_id,
                job_name=r.job_name,
                pool=r.pool,
                priority=r.priority,
                fire_at=r.fire_at,
                missed_at=r.missed_at,
            )
            for r in rows
        ]

    async def tenant_names(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
        async with self._read() as conn:
            return await tenant_names_of(conn, set(ids))

    # -- stalled schedules ---------------------------------------------------------

    async def jobs_schedule_probe(
        self, *, after: uuid.UUID | None = None, limit: int = 1000
    ) -> tuple[list[ScheduleProbe], uuid.UUID | None]:
        """Up to ``limit`` active recurring jobs after ``after`` by id, and every job
        marked stalled (up to ``limit``), each with its latest scheduled run. Returns
        them and where the next call goes on (None: the sweep is through)."""
        latest = (
            sa.select(runs.c.id)
            .where(
                runs.c.tenant_id == jobs.c.tenant_id,
                runs.c.job_id == jobs.c.id,
                runs.c.origin.in_(("once", "schedule")),
            )
            .order_by(runs.c.due_at.desc())
            .limit(1)
            .correlate(jobs)
            .scalar_subquery()
        )
        inner = sa.select(
            jobs.c.id,
            jobs.c.tenant_id,
            jobs.c.state,
            jobs.c.kind,
            jobs.c.schedule,
            jobs.c.template["lateness_budget"].as_float().label("budget"),
            jobs.c.template["spread"].as_float().label("spread"),
            jobs.c.created_at,
            jobs.c.schedule_stalled_at,
            latest.label("latest_id"),
        )
        sweep = inner.where(sa.text(RECURRING)).order_by(jobs.c.id).limit(limit)
        if after is not None:
            sweep = sweep.where(jobs.c.id > after)
        marked = inner.where(jobs.c.schedule_stalled_at.is_not(None)).limit(limit)
        probes: dict[uuid.UUID, ScheduleProbe] = {}
        async with self._read() as conn:
            swept = 0
            last: uuid.UUID | None = None
            for stmt, counts in ((sweep, True), (marked, False)):
                sub = stmt.subquery()
                rows = (
                    await conn.execute(
                        sa.select(sub, runs.c.due_at, runs.c.state.label("latest_state"))
                        .select_from(sub.outerjoin(runs, runs.c.id == sub.c.latest_id))
                        .order_by(sub.c.id)
                    )
                ).all()
                if counts:
                    swept = len(rows)
                    last = rows[-1].id if rows else None
                for r in rows:
                    probes[r.id] = ScheduleProbe(
                        job_id=r.id,
                        tenant_id=r.tenant_id,
                        state=r.state,
                        kind=r.kind,
                        schedule=dict(r.schedule),
                        lateness_budget=r.budget,
                        spread=r.spread or 0.0,
                        created_at=r.created_at,
                        stalled_at=r.schedule_stalled_at,
                        latest_due_at=r.due_at,
                        latest_state=r.latest_state,
                    )
        return list(probes.values()), (last if swept >= limit else None)

    async def jobs_mark_stalled(
        self,
        *,
        stalled: Sequence[tuple[uuid.UUID, str]],
        resumed: Sequence[tuple[uuid.UUID, str]],
        actor: str | None = None,
        now: datetime | None = None,
    ) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """Mark the jobs of ``stalled`` (id, why) stalled and clear those of
        ``resumed`` (id, why), each once: a job already so is left as it is. Returns
        the ids changed each way."""
        if not stalled and not resumed:
            return [], []
        async with self._write() as conn:
            at = await self._now(conn, now)
            events: list[dict[str, Any]] = []
            changed: list[list[uuid.UUID]] = []
            for items, mark, kind in (
                (stalled, True, "job.schedule_stalled"),
                (resumed, False, "job.schedule_resumed"),
            ):
                why = dict(items)
                if not why:
                    changed.append([])
                    continue
                cond = (
                    jobs.c.schedule_stalled_at.is_(None)
                    if mark
                    else jobs.c.schedule_stalled_at.is_not(None)
                )
                extra = [jobs.c.state == JobState.ACTIVE.value] if mark else []
                rows = (
                    await conn.execute(
                        jobs.update()
                        .where(self.driver.id_in(jobs.c.id, sorted(why)), cond, *extra)
                        .values(schedule_stalled_at=at if mark else None)
                        .returning(jobs.c.id, jobs.c.tenant_id)
                    )
                ).all()
                events += [
                    event_row(
                        at=at,
                        kind=kind,
                        tenant_id=r.tenant_id,
                        job_id=r.id,
                        actor=actor,
                        reason=why[r.id],
                    )
                    for r in rows
                ]
                changed.append(sorted(r.id for r in rows))
            await self._insert_events(conn, events)
        return changed[0], changed[1]

    async def jobs_stalled(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[StalledJob]:
        stmt = (
            sa.select(
                jobs.c.id,
                jobs.c.tenant_id,
                tenants.c.name.label("tenant_name"),
                jobs.c.name,
                jobs.c.template["pool"].as_string().label("pool"),
                jobs.c.schedule_stalled_at,
            )
            .select_from(jobs.join(tenants, tenants.c.id == jobs.c.tenant_id))
            .where(jobs.c.schedule_stalled_at.is_not(None))
            .order_by(jobs.c.schedule_stalled_at, jobs.c.id)
            .limit(limit)
        )
        if tenant_id is not None:
            stmt = stmt.where(jobs.c.tenant_id == tenant_id)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            StalledJob(
                job_id=r.id,
                tenant_id=r.tenant_id,
                tenant_name=r.tenant_name,
                job_name=r.name,
                pool=r.pool or "default",
                stalled_at=r.schedule_stalled_at,
            )
            for r in rows
        ]


def _late(fire_at: datetime, at: datetime) -> str:
    late = (at - fire_at).total_seconds()
    return f"not dispatched {late:.1f} s after its fire time (past its lateness budget)"
