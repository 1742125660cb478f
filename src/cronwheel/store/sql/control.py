"""Control of a job from outside its schedule: pause, resume, trigger, backfill.

A paused job keeps its runs. Its SCHEDULED runs stay SCHEDULED with their due instant
but their fire time *parked* at :data:`PARKED_FIRE_AT`, past the end of any due window,
so no scheduler fires them and none needs to know the job is paused::

    pause:   SCHEDULED  (fire_at = due)  ──▶ SCHEDULED (fire_at = PARKED)
             DISPATCHED                  ──▶ SCHEDULED (fire_at = PARKED)
             RUNNING                         untouched: it finishes
    resume:  SCHEDULED (fire_at = PARKED) ──▶ SCHEDULED (fire_at = due)

On resume a parked run whose due instant has passed fires at once, late, and the
job's catch-up policy decides what happens to it. A parked fire time is a value no
real schedule produces, so ``fire_at >= PARKED_FIRE_AT`` is exactly "parked by a
pause": triggered and backfilled runs of a paused job are never parked (they are
explicit requests) and a resume leaves them alone.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any, cast

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.bounds import BACKFILL_RATE_MAX, BACKFILL_RATE_MIN
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.model import Job, Run
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
    ScheduleSpec,
)
from cronwheel.domain.states import JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import event_row, job_from, new_run_row, run_from
from cronwheel.store.schema import jobs, runs
from cronwheel.store.sql.core import SqlCore, jobs_select
from cronwheel.timing import due_local, iter_occurrences

__all__ = ["PARKED_FIRE_AT", "ControlMixin", "stored_schedule"]

# The fire time of a paused job's runs: beyond every due window, and still a valid
# timestamp on both backends.
PARKED_FIRE_AT = datetime(9999, 1, 1, tzinfo=UTC)

_SCHEDULE_MODELS: dict[str, type[BaseModel]] = {
    "at": AtSchedule,
    "delay": DelaySchedule,
    "asap": AsapSchedule,
    "cron": CronSchedule,
    "interval": IntervalSchedule,
}
# Two triggers in the same microsecond would collide on UNIQUE(tenant, job, due_at):
# the later one takes the next free microsecond, within this many.
_TRIGGER_SLOTS = 1000
# Rows per INSERT: under the bind-parameter limits of asyncpg and SQLite.
_INSERT_CHUNK = 500

_PAUSED_REASON = "job paused"
_RESUMED_REASON = "resumed after pause"


def stored_schedule(kind: str, schedule: dict[str, Any]) -> ScheduleSpec:
    """A job's stored schedule (``jobs.kind``, ``jobs.schedule``) as its spec model."""
    return cast(ScheduleSpec, _SCHEDULE_MODELS[kind].model_validate(schedule))


class ControlMixin(SqlCore):
    async def jobs_pause(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._job_move(conn, tenant_id, job_id, JobState.ACTIVE, JobState.PAUSED, at)
            out = [
                event_row(
                    at=at,
                    kind="job.paused",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=actor,
                    reason=reason,
                )
            ]
            # SCHEDULED first: the DISPATCHED runs moved next must not be counted twice.
            for source, kind in (
                (RunState.SCHEDULED, "run.parked"),
                (RunState.DISPATCHED, "run.transition"),
            ):
                moved = (
                    await conn.execute(
                        runs.update()
                        .where(
                            runs.c.tenant_id == tenant_id,
                            runs.c.job_id == job_id,
                            runs.c.state == source.value,
                            runs.c.fire_at < PARKED_FIRE_AT,
                        )
                        .values(
                            state=RunState.SCHEDULED.value,
                            fire_at=PARKED_FIRE_AT,
                            dispatched_at=None,
                            reason=_PAUSED_REASON,
                        )
                        .returning(runs.c.id)
                    )
                ).all()
                out += [
                    event_row(
                        at=at,
                        kind=kind,
                        tenant_id=tenant_id,
                        job_id=job_id,
                        run_id=r.id,
                        from_state=source.value,
                        to_state=RunState.SCHEDULED.value,
                        actor=actor,
                        reason=_PAUSED_REASON,
                    )
                    for r in moved
                ]
            await self._insert_events(conn, out)
            return await self._job_read(conn, tenant_id, job_id)

    async def jobs_resume(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._job_move(conn, tenant_id, job_id, JobState.PAUSED, JobState.ACTIVE, at)
            released = (
                await conn.execute(
                    runs.update()
                    .where(
                        runs.c.tenant_id == tenant_id,
                        runs.c.job_id == job_id,
                        runs.c.state == RunState.SCHEDULED.value,
                        runs.c.fire_at >= PARKED_FIRE_AT,
                    )
                    .values(fire_at=runs.c.due_at, reason=_RESUMED_REASON)
                    .returning(runs.c.id, runs.c.shard, runs.c.due_at)
                )
            ).all()
            out = [
                event_row(
                    at=at,
                    kind="job.resumed",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=actor,
                    reason=reason,
                )
            ]
            out += [
                event_row(
                    at=at,
                    kind="run.unparked",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    run_id=r.id,
                    from_state=RunState.SCHEDULED.value,
                    to_state=RunState.SCHEDULED.value,
                    actor=actor,
                    reason=_RESUMED_REASON,
                )
                for r in released
            ]
            await self._insert_events(conn, out)
            notices = [
                announce(r.id, r.shard, r.due_at)
                for r in released
                if r.due_at < at + ANNOUNCE_HORIZON
            ]
            if notices:
                await self._notify(conn, CHANNEL_RUNS_NEW, notices)
            return await self._job_read(conn, tenant_id, job_id)

    async def jobs_trigger(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        payload: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> Run:
        async with self._write() as conn:
            at = await self._now(conn, now)
            job = await self._job_for_update(conn, tenant_id, job_id)
            if job.state is JobState.CANCELLED:
                raise IllegalTransitionError(
                    f"job {job_id} is cancelled and cannot be triggered",
                    source=job.state.value,
                    target="triggered",
                )
            template = dict(job.template)
            template["payload"] = {**(template.get("payload") or {}), **(payload or {})}
            schedule = stored_schedule(job.kind, job.schedule)
            shard = shard_of(tenant_id, job_id)
            run_id = new_id()
            for slot in range(_TRIGGER_SLOTS):
                due = at + timedelta(microseconds=slot)
                row = new_run_row(
                    run_id=run_id,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    name=job.name,
                    template=template,
                    due_at=due,
                    due_local=due_local(schedule, due),
                    shard=shard,
                    at=at,
                    origin="trigger",
                )
                await conn.execute(self.driver.insert_ignore(runs, [row]))
                created = await self._runs_by_id(conn, tenant_id, [run_id])
                if created:
                    break
            else:
                raise IllegalTransitionError(
                    f"job {job_id} has a run due at every microsecond of the next "
                    f"{_TRIGGER_SLOTS}: try again",
                    source=job.state.value,
                    target="triggered",
                )
            [run] = created
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="job.triggered",
                        tenant_id=tenant_id,
                        job_id=job_id,
                        run_id=run.id,
                        actor=actor,
                        data={"payload_keys": sorted(payload or {})},
                    ),
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=tenant_id,
                        job_id=job_id,
                        run_id=run.id,
                        to_state=RunState.SCHEDULED.value,
                        actor=actor,
                        reason="triggered",
                    ),
                ],
            )
            await self._notify(conn, CHANNEL_RUNS_NEW, [announce(run.id, shard, run.fire_at)])
        return run

    async def jobs_backfill(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        start: datetime,
        end: datetime,
        actor: str | None = None,
        rate: float = 10.0,
        limit: int = 10_000,
        now: datetime | None = None,
    ) -> list[Run]:
        if not BACKFILL_RATE_MIN <= rate <= BACKFILL_RATE_MAX:
            raise ValidationError(
                f"rate must be {BACKFILL_RATE_MIN:g} to {BACKFILL_RATE_MAX:g} runs a second, "
                f"not {rate!r}",
                field="rate",
            )
        async with self._write() as conn:
            at = await self._now(conn, now)
            job = await self._job_for_update(conn, tenant_id, job_id)
            _check_range(start, end, at)
            schedule = stored_schedule(job.kind, job.schedule)
            if not isinstance(schedule, CronSchedule | IntervalSchedule):
                raise ValidationError(
                    f"job {job_id} has a one-off schedule ({job.kind}): only cron and "
                    "interval jobs can be backfilled",
                    field="schedule",
                )
            if job.state is JobState.CANCELLED:
                raise IllegalTransitionError(
                    f"job {job_id} is cancelled and cannot be backfilled",
                    source=job.state.value,
                    target="backfilled",
                )
            found = list(islice(iter_occurrences(schedule, start, end), limit + 1))
            if len(found) > limit:
                raise ValidationError(
                    f"the range holds more than {limit} occurrences: backfill it in parts",
                    field="to",
                )
            shard = shard_of(tenant_id, job_id)
            rows: list[dict[str, Any]] = []
            for i, occurrence in enumerate(found):
                row = new_run_row(
                    run_id=new_id(),
                    tenant_id=tenant_id,
                    job_id=job_id,
                    name=job.name,
                    template=job.template,
                    due_at=occurrence.utc,
                    due_local=due_local(schedule, occurrence.utc),
                    shard=shard,
                    at=at,
                    origin="backfill",
                    fire_at=at + timedelta(seconds=i / rate),
                )
                row["reason"] = occurrence.reason
                rows.append(row)
            for chunk in _chunks(rows):
                await conn.execute(self.driver.insert_ignore(runs, chunk))
            # An occurrence that already had a run kept it: what exists under the new
            # ids is exactly what this call created.
            created = await self._runs_by_id(conn, tenant_id, [r["id"] for r in rows])
            out = [
                event_row(
                    at=at,
                    kind="job.backfilled",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=actor,
                    data={
                        "from": start.astimezone(UTC).isoformat(),
                        "to": end.astimezone(UTC).isoformat(),
                        "occurrences": len(found),
                        "created": len(created),
                        "rate": rate,
                    },
                )
            ]
            out += [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    run_id=run.id,
                    to_state=RunState.SCHEDULED.value,
                    actor=actor,
                    reason="backfill",
                )
                for run in created
            ]
            await self._insert_events(conn, out)
            notices = [
                announce(run.id, shard, run.fire_at)
                for run in created
                if run.fire_at < at + ANNOUNCE_HORIZON
            ]
            if notices:
                await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        return created

    # -- shared steps --------------------------------------------------------------

    async def _job_move(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        source: JobState,
        target: JobState,
        at: datetime,
    ) -> None:
        """Move the job from ``source`` to ``target`` in one conditional UPDATE, or raise
        (NotFoundError, or IllegalTransitionError naming its state). The job's live runs
        are locked first, in id order, as every path that changes runs and their job
        does (see ``_lock_live_runs``)."""
        await self._lock_live_runs(conn, tenant_id, runs.c.job_id == job_id)
        row = (
            await conn.execute(
                jobs.update()
                .where(
                    jobs.c.tenant_id == tenant_id,
                    jobs.c.id == job_id,
                    jobs.c.state == source.value,
                )
                .values(state=target.value, updated_at=at, version=jobs.c.version + 1)
                .returning(jobs.c.id)
            )
        ).first()
        if row is None:
            current = await self._job_for_update(conn, tenant_id, job_id)
            verb = {JobState.PAUSED: "paused", JobState.ACTIVE: "resumed"}[target]
            raise IllegalTransitionError(
                f"job {job_id} is {current.state.value} and cannot be {verb}",
                source=current.state.value,
                target=target.value,
            )

    async def _job_read(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> Job:
        """The job as ``jobs_get`` answers it (``next_due_at`` from its pending runs),
        read after this transaction's changes."""
        row = (
            await conn.execute(
                jobs_select().where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
            )
        ).one()
        return job_from(row)

    async def _job_for_update(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> Job:
        """The job, locked until the transaction ends (PostgreSQL) so a concurrent
        cancel cannot slip between reading its state and adding runs."""
        row = (
            await conn.execute(
                jobs.select()
                .where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
                .with_for_update()
            )
        ).first()
        if row is None:
            raise self._not_found("job", job_id)
        return job_from(row)

    async def _runs_by_id(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, run_ids: list[uuid.UUID]
    ) -> list[Run]:
        """The runs among ``run_ids`` that exist, by due instant."""
        found: list[Row[Any]] = []
        for start in range(0, len(run_ids), _INSERT_CHUNK):
            ids = run_ids[start : start + _INSERT_CHUNK]
            found += (
                await conn.execute(
                    sa.select(*runs.c).where(
                        runs.c.tenant_id == tenant_id, self.driver.id_in(runs.c.id, ids)
                    )
                )
            ).all()
        return sorted((run_from(r) for r in found), key=lambda r: r.due_at)


def _check_range(start: datetime, end: datetime, now: datetime) -> None:
    for name, value in (("from", start), ("to", end)):
        if value.tzinfo is None:
            raise ValidationError(f"{name}: must have a UTC offset", field=name)
    if start >= now:
        raise ValidationError(
            f"from: {start.isoformat()} is not in the past (now is {now.isoformat()})",
            field="from",
        )
    if end > now:
        raise ValidationError(
            f"to: {end.isoformat()} is in the future (now is {now.isoformat()}); "
            "a backfill covers past occurrences only",
            field="to",
        )
    if end <= start:
        raise ValidationError("to: must be after 'from'", field="to")


def _chunks(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [rows[i : i + _INSERT_CHUNK] for i in range(0, len(rows), _INSERT_CHUNK)]
