"""Editing a job (``jobs_update``): its new definition, written only while the job is
at the version the edit was made from, and what becomes of its runs, in one
transaction.

Only the job's *pending occurrence* follows the edit: its SCHEDULED run of origin
``once`` or ``schedule`` not yet tried (attempt 0), parked by a pause or not — the run
``next_due_at`` shows. Every other run keeps what it was made with::

    occurrences changed   the pending occurrence ──▶ moved in place (the same run, its
                          (schedule, spread)          id kept) to the first occurrence of
                                                      the new schedule from now that no
                                                      other run of the job has: due_at,
                                                      due_local, fire_at (still parked if
                                                      the job is paused); run.rescheduled
                          any other one (queued   ──▶ SKIPPED, "job edited"
                          behind a running run)
                          none                    ──▶ one is created
    template changed      the pending occurrence ──▶ template columns rewritten; run.edited
    untouched             DISPATCHED (dispatched ahead, reserved or not), RUNNING,
                          finished; triggered, backfilled, replayed runs; retries

Moving the run rather than replacing it leaves no finished run at an instant the new
schedule may reach again (``UNIQUE(job, due_at)`` would stop the job's chain of
occurrences there), and keeps a one-off job's run id.

Against a scheduler node: the job's live runs are locked first (``_lock_live_runs``),
as firing and every other change of runs locks them, and firing is conditional on the
row — its state and its fire time. A node holding the run in its due window fires it
either before the edit (it is then DISPATCHED: the edit leaves it, and the next
occurrence firing made is the pending one the edit moves) or after, as the edit left
it: with the new template, and not before its new fire time. The moved run is
announced, and a node's window holds it at its new instant (``scheduler/window.py``).
A reservation is a DISPATCHED run: the edit leaves it, and it starts as reserved.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import ConflictError, StaleVersionError
from cronwheel.domain.job_edit import JobEdit, check_editable
from cronwheel.domain.model import Job
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.spec import ONE_OFF_KINDS, CronSchedule, IntervalSchedule, schedule_kind
from cronwheel.domain.states import SKIP, JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import (
    event_row,
    job_from,
    new_run_row,
    run_template_values,
)
from cronwheel.store.schema import PARKED_FIRE_AT, jobs, runs
from cronwheel.store.sql.jobs import JobsMixin, stored_schedule
from cronwheel.store.sql.overlay import (
    check_override_timeouts,
    job_overlay_written,
    runs_overlaid,
    template_fields,
)
from cronwheel.store.sql.statements import PAUSED_REASON, insert_ignoring, may
from cronwheel.timing import due_local, iter_occurrences
from cronwheel.timing.spread import spread_instant

__all__ = ["EDITED_REASON", "EditsMixin"]

EDITED_REASON = "job edited"


class _Pending(NamedTuple):
    id: uuid.UUID
    due_at: datetime
    fire_at: datetime
    shard: int


class _Changes:
    """The history and the notices an edit's changes of runs make."""

    def __init__(self, job: Job, at: datetime, by: str | None) -> None:
        self.job, self.at, self.by = job, at, by
        self.events: list[dict[str, Any]] = []
        self.notices: list[str] = []

    def event(
        self, run_id: uuid.UUID, kind: str, *, reason: str | None = EDITED_REASON, **fields: Any
    ) -> None:
        self.events.append(
            event_row(
                at=self.at,
                kind=kind,
                tenant_id=self.job.tenant_id,
                job_id=self.job.id,
                run_id=run_id,
                actor=self.by,
                reason=reason,
                **fields,
            )
        )

    def announce(self, run_id: uuid.UUID, shard: int, fire_at: datetime) -> None:
        """Tell the schedulers of a run due soon (a parked one is due never)."""
        if fire_at < self.at + ANNOUNCE_HORIZON:
            self.notices.append(announce(run_id, shard, fire_at))


class EditsMixin(JobsMixin):
    async def jobs_update(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        edit: JobEdit,
        actor: Actor | None = None,
        reason: str | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> Job:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._lock_jobs_with_runs(conn, tenant_id, [job_id])
            job = await self._job_edited(conn, tenant_id, job_id, edit, at)
            if "progress_timeout" in edit.after:
                await check_override_timeouts(conn, job)
            changes = _Changes(job, at, name_of(actor))
            if edit.occurrence is not None:
                await self._pending_moved(conn, job, edit, changes)
            elif edit.rewrites:
                await self._pending_rewritten(conn, job, changes)
            if edit.occurrence is not None or edit.rewrites:
                await self._overrides_kept(conn, job, changes, max_payload_bytes)
            edited = event_row(
                at=at,
                kind="job.edited",
                tenant_id=tenant_id,
                job_id=job_id,
                actor=changes.by,
                reason=reason,
                data={"version": job.version, "before": edit.before, "after": edit.after},
            )
            await self._insert_events(conn, [edited, *changes.events])
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="job.edit",
                target_kind="job",
                target_id=job_id,
                reason=reason,
                before=edit.before,
                after=edit.after,
            )
            if changes.notices:
                await self._notify(conn, CHANNEL_RUNS_NEW, changes.notices)
            return await self._job_read(conn, tenant_id, job_id)

    async def _job_edited(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        edit: JobEdit,
        at: datetime,
    ) -> Job:
        """The job as ``edit`` makes it, written in one conditional UPDATE (its version
        and state the conditions), or the error saying why not."""
        template = edit.template
        row = (
            await conn.execute(
                jobs.update()
                .where(
                    jobs.c.tenant_id == tenant_id,
                    jobs.c.id == job_id,
                    jobs.c.version == edit.version,
                    jobs.c.state.in_((JobState.ACTIVE.value, JobState.PAUSED.value)),
                )
                .values(
                    name=edit.spec.name,
                    kind=schedule_kind(edit.spec.schedule),
                    schedule=edit.spec.schedule.model_dump(mode="json"),
                    template=template.to_json(),
                    tags=template.tags,
                    updated_at=at,
                    version=jobs.c.version + 1,
                )
                .returning(*jobs.c)
            )
        ).first()
        if row is not None:
            return job_from(row)
        current = await self._job_for_update(conn, tenant_id, job_id)  # or not found
        check_editable(current)
        raise StaleVersionError(
            f"job {job_id} is at version {current.version}, not {edit.version}: it changed "
            "since it was read; read it again and edit what it is now",
            current_version=current.version,
        )

    async def _overrides_kept(
        self, conn: AsyncConnection, job: Job, changes: _Changes, max_payload_bytes: int | None
    ) -> None:
        """The job's overrides on its new template: its ``future`` ones as new runs
        take them, and the pending occurrence's own made again over the template's
        fields (``overlay.py``); a payload so made past ``max_payload_bytes``: 413."""
        futures = await job_overlay_written(conn, job, max_payload_bytes=max_payload_bytes)
        pending = [p.id for p in await self._pending(conn, job)]
        if not pending:
            return
        where = self.driver.id_in(runs.c.id, pending)
        if not futures:
            where = sa.and_(where, runs.c.overrides.is_not(None))
        await runs_overlaid(
            conn,
            self.driver,
            job.tenant_id,
            where,
            add=futures,
            rebase=template_fields(job.template),
            max_payload_bytes=max_payload_bytes,
        )

    async def _pending(self, conn: AsyncConnection, job: Job) -> list[_Pending]:
        """The job's pending occurrences (see the module docstring), by due instant."""
        rows = await conn.execute(
            sa.select(runs.c.id, runs.c.due_at, runs.c.fire_at, runs.c.shard)
            .where(
                runs.c.tenant_id == job.tenant_id,
                runs.c.job_id == job.id,
                runs.c.state == RunState.SCHEDULED.value,
                runs.c.attempt == 0,
                runs.c.origin.in_(("once", "schedule")),
            )
            .order_by(runs.c.due_at)
        )
        return [_Pending(*r) for r in rows]

    async def _pending_rewritten(self, conn: AsyncConnection, job: Job, changes: _Changes) -> None:
        """The template columns of the job's pending occurrences, as the job's now."""
        pending = await self._pending(conn, job)
        if not pending:
            return
        await conn.execute(
            runs.update()
            .where(
                runs.c.tenant_id == job.tenant_id,
                self.driver.id_in(runs.c.id, [p.id for p in pending]),
            )
            .values(run_template_values(job.name, job.template))
        )
        for p in pending:
            changes.event(p.id, "run.edited")
            # A node that passed over it while the edit held it looks again at once.
            changes.announce(p.id, p.shard, p.fire_at)

    async def _pending_moved(
        self, conn: AsyncConnection, job: Job, edit: JobEdit, changes: _Changes
    ) -> None:
        """The job's pending occurrence moved to the new schedule's first free one (see
        the module docstring); the others skipped; the wall times a DST gap skips before
        it recorded, as for a new job."""
        assert edit.occurrence is not None
        if job.kind in ONE_OFF_KINDS:
            await self._refuse_started(conn, job)
        pending = await self._pending(conn, job)
        due, local = await self._free_occurrence(conn, job, edit, {p.id for p in pending})
        keep = next((p for p in pending if p.due_at == due), pending[-1] if pending else None)
        await self._withdraw(conn, job, [p.id for p in pending if p is not keep], changes)
        paused = job.state is JobState.PAUSED
        fire_at = PARKED_FIRE_AT if paused else spread_instant(job.id, due, job.template.spread)
        if keep is None:
            await self._occurrence_added(conn, job, due, local, fire_at, changes)
        else:
            values: dict[str, Any] = {
                **run_template_values(job.name, job.template),
                "due_at": due,
                "due_local": local,
                "fire_at": fire_at,
                "overlap_queued": False,
            }
            if paused:
                values["reason"] = PAUSED_REASON
            await conn.execute(runs.update().where(runs.c.id == keep.id).values(values))
            moved = {
                "before": {"due_at": keep.due_at.isoformat(), "fire_at": keep.fire_at.isoformat()},
                "after": {"due_at": due.isoformat(), "fire_at": fire_at.isoformat()},
            }
            changes.event(
                keep.id,
                "run.rescheduled",
                from_state=RunState.SCHEDULED.value,
                to_state=RunState.SCHEDULED.value,
                data=moved,
            )
            changes.announce(keep.id, keep.shard, fire_at)
        await self._gap_skipped(conn, job, edit, changes)
        await conn.execute(
            jobs.update()
            .where(jobs.c.tenant_id == job.tenant_id, jobs.c.id == job.id)
            .values(next_due_at=due)
        )

    async def _refuse_started(self, conn: AsyncConnection, job: Job) -> None:
        """A one-off job's instant changes only while its run waits for it: never once
        the run was dispatched (ahead of its instant, or reserved) or tried."""
        started = (
            await conn.execute(
                sa.select(runs.c.id, runs.c.state)
                .where(
                    runs.c.tenant_id == job.tenant_id,
                    runs.c.job_id == job.id,
                    runs.c.origin == "once",
                    sa.or_(
                        runs.c.state.in_((RunState.DISPATCHED.value, RunState.RUNNING.value)),
                        sa.and_(runs.c.state == RunState.SCHEDULED.value, runs.c.attempt > 0),
                    ),
                )
                .limit(1)
            )
        ).first()
        if started is not None:
            raise ConflictError(
                f"job {job.id} is one-off and its run {started.id} is {started.state}: its "
                "schedule can change only before the run is dispatched",
                field="schedule",
                run_id=str(started.id),
                run_state=started.state,
            )

    async def _free_occurrence(
        self, conn: AsyncConnection, job: Job, edit: JobEdit, pending: set[uuid.UUID]
    ) -> tuple[datetime, str | None]:
        """The first occurrence of the new schedule from the edit's instant that no run
        of the job has but a pending occurrence (one dispatched ahead of its instant
        has its occurrence), with its local form. A one-off job's instant is the one
        given: taken by another run, it is a conflict."""
        assert edit.occurrence is not None and edit.occurrence.first_due_at is not None
        first = edit.occurrence.first_due_at
        taken = {
            r.due_at
            for r in await conn.execute(
                sa.select(runs.c.id, runs.c.due_at).where(
                    runs.c.tenant_id == job.tenant_id,
                    runs.c.job_id == job.id,
                    runs.c.due_at >= first,
                )
            )
            if r.id not in pending
        }
        if first not in taken:
            return first, edit.occurrence.due_local
        schedule = stored_schedule(job.kind, job.schedule)
        if isinstance(schedule, CronSchedule | IntervalSchedule):
            for occurrence in iter_occurrences(schedule, first):
                if occurrence.utc not in taken:
                    return occurrence.utc, due_local(schedule, occurrence.utc)
        raise ConflictError(
            f"another run of job {job.id} is due at {first.isoformat()}: give another instant",
            field="schedule",
        )

    async def _withdraw(
        self, conn: AsyncConnection, job: Job, run_ids: list[uuid.UUID], changes: _Changes
    ) -> None:
        """Pending occurrences of the old schedule that the new one has no place for:
        SKIPPED."""
        if not run_ids:
            return
        skipped = await conn.execute(
            runs.update()
            .where(
                runs.c.tenant_id == job.tenant_id,
                self.driver.id_in(runs.c.id, run_ids),
                may(SKIP),
            )
            .values(
                state=RunState.SKIPPED.value,
                finished_at=changes.at,
                reason=EDITED_REASON,
                overlap_queued=False,
            )
            .returning(runs.c.id)
        )
        for r in skipped:
            changes.event(
                r.id,
                "run.transition",
                from_state=SKIP.source.value,
                to_state=RunState.SKIPPED.value,
            )

    async def _occurrence_added(
        self,
        conn: AsyncConnection,
        job: Job,
        due: datetime,
        local: str | None,
        fire_at: datetime,
        changes: _Changes,
    ) -> None:
        """A pending occurrence for a job that had none."""
        shard = shard_of(job.tenant_id, job.id)
        row = new_run_row(
            run_id=new_id(),
            tenant_id=job.tenant_id,
            job_id=job.id,
            name=job.name,
            template=job.template,
            due_at=due,
            due_local=local,
            shard=shard,
            at=changes.at,
            origin="once" if job.kind in ONE_OFF_KINDS else "schedule",
            fire_at=fire_at,
        )
        if job.state is JobState.PAUSED:
            row["reason"] = PAUSED_REASON
        await conn.execute(runs.insert().values(row))
        changes.event(row["id"], "run.transition", to_state=RunState.SCHEDULED.value)
        changes.announce(row["id"], shard, fire_at)

    async def _gap_skipped(
        self, conn: AsyncConnection, job: Job, edit: JobEdit, changes: _Changes
    ) -> None:
        """The wall times a spring-forward gap skips between the edit and the new first
        occurrence (``on_nonexistent="skip"``): recorded SKIPPED, as a new job's are."""
        assert edit.occurrence is not None
        if not edit.occurrence.skipped:
            return
        shard = shard_of(job.tenant_id, job.id)
        rows = []
        for skip in edit.occurrence.skipped:
            row = new_run_row(
                run_id=new_id(),
                tenant_id=job.tenant_id,
                job_id=job.id,
                name=job.name,
                template=job.template,
                due_at=skip.due_at,
                due_local=skip.due_local,
                shard=shard,
                at=changes.at,
                origin="schedule",
                state=RunState.SKIPPED,
            )
            rows.append(row | {"reason": skip.reason, "finished_at": changes.at})
        made = await insert_ignoring(conn, self.driver, runs, rows, (runs.c.id, runs.c.reason))
        for r in made:
            changes.event(
                r.id, "run.transition", reason=r.reason, to_state=RunState.SCHEDULED.value
            )
            changes.event(
                r.id,
                "run.transition",
                reason=r.reason,
                from_state=RunState.SCHEDULED.value,
                to_state=RunState.SKIPPED.value,
            )
