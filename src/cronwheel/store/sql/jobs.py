"""Jobs, the definitions: creating them (with their first run), reading and listing
them, and the changes of their state — cancel, pause, resume — with what each does
to the job's runs.

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
explicit requests) and a resume leaves them alone. The steps themselves, for any number
of jobs at once, are ``store/sql/holds.py``'s (a bulk pause takes them too).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import (
    ConflictError,
    IdempotencyConflictError,
    IllegalTransitionError,
)
from cronwheel.domain.model import Job, NewJob, Page, Run
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
    ScheduleSpec,
    schedule_kind,
)
from cronwheel.domain.states import JobState, RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.domain.workflow import WORKFLOW_POOL
from cronwheel.ids import new_id
from cronwheel.store.driver import NewJobRows, given_instant
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import (
    EVENT_SHARED,
    NEW_RUN_COLUMNS,
    audit_record,
    event_record,
    event_row,
    job_from,
    new_run_record,
    run_from,
    run_from_mapping,
    uuid_cursor,
)
from cronwheel.store.schema import jobs, runs
from cronwheel.store.sql.core import jobs_select
from cronwheel.store.sql.holds import HoldsMixin
from cronwheel.store.sql.pending import pending_admit, tenant_for_new_runs
from cronwheel.timing.spread import spread_instant

__all__ = ["JobsMixin", "stored_schedule"]


def _request_hash(nj: NewJob) -> str:
    """What a replay under the same Idempotency-Key must match: the job's request, and a
    workflow's DAG with it (a job's hash is as it always was)."""
    request: Any = nj.spec.model_dump(mode="json")
    if nj.workflow is not None:
        request = {"job": request, "workflow": nj.workflow}
    body = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


_SCHEDULE_MODELS: dict[str, type[BaseModel]] = {
    "at": AtSchedule,
    "delay": DelaySchedule,
    "asap": AsapSchedule,
    "cron": CronSchedule,
    "interval": IntervalSchedule,
}


# A large batch's rows are made and inserted in parts of this many jobs, the database
# inserting one part while the next is made: smaller parts overlap more of the two, but
# each costs a few round trips. The maker yields to the loop every few jobs so that a
# part's next COPY starts as soon as the one before is in.
_PART = 128
_YIELD_EVERY = 4


_ACTIVE = JobState.ACTIVE.value

# The audit trail's verb for a job moved into each state.
_VERBS = {JobState.CANCELLED: "cancel", JobState.PAUSED: "pause", JobState.ACTIVE: "resume"}

# New runs that fire later than this are announced within _NOTICE_WAIT seconds, not at
# once: their notices share a statement with those of the creates that follow.
_NOTICE_SOON = timedelta(seconds=1)
_NOTICE_WAIT = 0.02


def stored_schedule(kind: str, schedule: dict[str, Any]) -> ScheduleSpec:
    """A job's stored schedule (``jobs.kind``, ``jobs.schedule``) as its spec model."""
    return cast(ScheduleSpec, _SCHEDULE_MODELS[kind].model_validate(schedule))


class _Made(NamedTuple):
    """One job of a creation's answer: the job, its first run's id and that run — its
    row's values when new (a record is made of them only when asked for), its record
    when read back for a key's replay — and whether the job was created."""

    job: Job
    run_id: uuid.UUID | None
    run: Run | tuple[Any, ...] | None
    created: bool

    def run_record(self) -> Run | None:
        run = self.run
        if run is None or isinstance(run, Run):
            return run
        return run_from_mapping(dict(zip(NEW_RUN_COLUMNS, run, strict=True)))


class _NewJobs:
    """The rows of new jobs of one tenant created at ``at`` — each job, its skipped
    occurrences and first run, their events and the notices of runs due soon — and the
    records they make, built from those rows (nothing is read back)."""

    def __init__(self, tenant_id: uuid.UUID, at: datetime) -> None:
        self.tenant_id = tenant_id
        self.at = at
        self.jobs: list[tuple[Any, ...]] = []
        self.runs: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.notices: list[str] = []
        self.soonest: datetime | None = None  # the earliest fire time announced
        self._announced_before = at + ANNOUNCE_HORIZON
        self.first_runs = 0
        # By request (its actor): the jobs it created, each id and name, for its audit
        # record: one per request, however many jobs it made.
        self._created_by: dict[Actor, list[tuple[uuid.UUID, str]]] = {}
        # By actor: what a job's two creation events share (``EVENT_SHARED`` values),
        # each checked once, not once per job.
        self._created: dict[str | None, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}

    def rows(self) -> NewJobRows:
        return NewJobRows(
            jobs=self.jobs, runs=self.runs, events=self.events, audit=self.audit_records()
        )

    def audit_records(self) -> list[tuple[Any, ...]]:
        """One audit record per request: ``job.create`` of its job, or of its batch."""
        out = []
        after: dict[str, Any]
        for actor, made in self._created_by.items():
            if len(made) == 1:
                [(job_id, name)] = made
                target, after = job_id, {"name": name}
            else:
                target, after = None, {"count": len(made), "jobs": [i for i, _ in made]}
            out.append(
                audit_record(
                    actor,
                    at=self.at,
                    tenant_id=self.tenant_id,
                    action="job.create",
                    target_kind="job",
                    target_id=target,
                    after=after,
                )
            )
        return out

    async def parts(
        self, new_jobs: Iterable[NewJob], out: list[_Made]
    ) -> AsyncGenerator[NewJobRows, None]:
        """The rows of ``new_jobs`` (without keys), made and answered into ``out`` part by
        part as they are read, yielding to the loop every few jobs: a driver inserts
        one part while the next is made (``Driver.jobs_insert_alone``)."""
        jobs_in = iter(new_jobs)
        part = list(itertools.islice(jobs_in, _PART))
        while part:
            jobs_at, runs_at, events_at = len(self.jobs), len(self.runs), len(self.events)
            for index, nj in enumerate(part, 1):
                out.append(self.add(nj, None))
                if index % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            part = list(itertools.islice(jobs_in, _PART))
            yield NewJobRows(
                jobs=self.jobs[jobs_at:],
                runs=self.runs[runs_at:],
                events=self.events[events_at:],
                audit=() if part else self.audit_records(),  # with the last part
            )

    def _creation_events(self, actor: str | None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        found = self._created.get(actor)
        if found is None:
            created = event_record(
                at=self.at, kind="job.created", tenant_id=self.tenant_id, actor=actor
            )
            scheduled = event_record(
                at=self.at,
                kind="run.transition",
                tenant_id=self.tenant_id,
                to_state=RunState.SCHEDULED.value,
                actor=actor,
                reason="job created",
            )
            found = self._created[actor] = (created[:EVENT_SHARED], scheduled[:EVENT_SHARED])
        return found

    def add(self, nj: NewJob, request_hash: str | None) -> _Made:
        spec, at, tenant_id = nj.spec, self.at, self.tenant_id
        job_id = new_id()
        kind = schedule_kind(spec.schedule)
        # One dump for the template and the schedule: two cost twice.
        spec_json = spec.model_dump(mode="json")
        template = RunTemplate.of_spec_json(spec_json)
        template_json = RunTemplate.json_of_spec_json(spec_json)
        if nj.workflow is not None:
            # A workflow run is leased by no worker: its nodes are (``dag.start``).
            template = replace(
                template, task=None, pool=WORKFLOW_POOL, requires=[], route_tags=[], payload={}
            )
            template_json = template.to_json()
        created, scheduled = self._creation_events(name_of(nj.actor))
        if nj.actor is not None:
            self._created_by.setdefault(nj.actor, []).append((job_id, spec.name))
        # In the order of NEW_JOB_COLUMNS.
        self.jobs.append(
            (
                job_id,
                tenant_id,
                spec.name,
                _ACTIVE,
                kind,
                spec_json["schedule"],
                template_json,
                template.tags,
                1,
                nj.first_due_at,
                nj.idempotency_key,
                request_hash,
                at,
                at,
            )
        )
        # The events' own values after what they share: job, run, attempt, data.
        self.events.append((*created, job_id, None, None, {"name": spec.name, "schedule": kind}))
        shard = shard_of(tenant_id, job_id)
        for skip in nj.skipped:
            self._skipped(nj, job_id, template, shard, skip.due_at, skip.due_local, skip.reason)
        run_id: uuid.UUID | None = None
        run: tuple[Any, ...] | None = None
        if nj.first_due_at is not None:
            run_id = new_id()
            fire_at = spread_instant(job_id, nj.first_due_at, template.spread)
            run = new_run_record(
                run_id=run_id,
                tenant_id=tenant_id,
                job_id=job_id,
                name=spec.name,
                template=template,
                due_at=nj.first_due_at,
                due_local=nj.due_local,
                shard=shard,
                at=at,
                origin="schedule" if spec.is_recurring else "once",
                fire_at=fire_at,
            )
            self.runs.append(run)
            self.first_runs += 1
            self.events.append((*scheduled, job_id, run_id, None, None))
            if fire_at < self._announced_before:
                self.notices.append(announce(run_id, shard, fire_at))
                if self.soonest is None or fire_at < self.soonest:
                    self.soonest = fire_at
        job = Job(
            id=job_id,
            tenant_id=tenant_id,
            name=spec.name,
            state=JobState.ACTIVE,
            kind=kind,
            schedule=spec_json["schedule"],
            template=template,
            version=1,
            next_due_at=nj.first_due_at,
            created_at=at,
            updated_at=at,
            idempotency_key=nj.idempotency_key,
            workflow=nj.workflow,
        )
        return _Made(job, run_id, run, True)

    def _skipped(
        self,
        nj: NewJob,
        job_id: uuid.UUID,
        template: RunTemplate,
        shard: int,
        due_at: datetime,
        due_local: str | None,
        reason: str,
    ) -> None:
        """A skipped occurrence: created SCHEDULED and skipped at once, as the scheduler
        records the occurrences it skips (every history starts in SCHEDULED)."""
        skipped_id = new_id()
        self.runs.append(
            new_run_record(
                run_id=skipped_id,
                tenant_id=self.tenant_id,
                job_id=job_id,
                name=nj.spec.name,
                template=template,
                due_at=due_at,
                due_local=due_local,
                shard=shard,
                at=self.at,
                origin="schedule",
                state=RunState.SKIPPED,
                reason=reason,
                finished_at=self.at,
            )
        )
        self.events += [
            event_record(
                at=self.at,
                kind="run.transition",
                tenant_id=self.tenant_id,
                job_id=job_id,
                run_id=skipped_id,
                from_state=source,
                to_state=target.value,
                actor=name_of(nj.actor),
                reason=reason,
            )
            for source, target in (
                (None, RunState.SCHEDULED),
                (RunState.SCHEDULED.value, RunState.SKIPPED),
            )
        ]


class JobsMixin(HoldsMixin):
    async def jobs_create_many(
        self,
        tenant_id: uuid.UUID,
        *,
        jobs: Sequence[NewJob],
        now: datetime | None = None,
    ) -> list[tuple[Job, Run | None, bool]]:
        made = await self._jobs_made(tenant_id, jobs, now)
        return [(m.job, m.run_record(), m.created) for m in made]

    async def jobs_create_many_brief(
        self,
        tenant_id: uuid.UUID,
        *,
        jobs: Sequence[NewJob],
        now: datetime | None = None,
    ) -> list[tuple[Job, uuid.UUID | None, bool]]:
        made = await self._jobs_made(tenant_id, jobs, now)
        return [(m.job, m.run_id, m.created) for m in made]

    async def _jobs_made(
        self, tenant_id: uuid.UUID, jobs: Sequence[NewJob], now: datetime | None
    ) -> list[_Made]:
        # Two requests racing with one idempotency key: the loser's insert fails on the
        # unique key; on the second pass it finds the winner's job.
        for attempt in range(2):
            try:
                made, out = await self._jobs_create(tenant_id, jobs, now)
            except Exception as exc:
                broken = self.driver.integrity_error(exc)
                if broken is None:
                    raise
                if attempt == 1 or "idempotency" not in broken.lower():
                    raise ConflictError(f"the jobs could not be stored: {broken}") from None
            else:
                if made.notices:
                    # A run due soon is announced at once; later ones may wait a moment
                    # to share their notice with the next creates' (the schedulers need
                    # them long before their instant).
                    soon = made.soonest is not None and made.soonest < made.at + _NOTICE_SOON
                    self.driver.notify_committed(
                        CHANNEL_RUNS_NEW,
                        made.notices,
                        self._deliver,
                        within=0.0 if soon else _NOTICE_WAIT,
                    )
                return out
        raise AssertionError("unreachable")

    async def _jobs_create(
        self,
        tenant_id: uuid.UUID,
        new_jobs: Sequence[NewJob],
        now: datetime | None,
    ) -> tuple[_NewJobs, list[_Made]]:
        """The rows written (their notices to send) and the answer, built from them.

        When the caller knows the instant and no key was given, the jobs are one
        statement that is a transaction of its own (``jobs_insert_alone``); only a
        tenant with ``max_pending_runs`` then takes a transaction that counts and adds
        (nothing was inserted by the first). A key's replay is read in the transaction
        that inserts the rest."""
        if now is not None and not any(nj.idempotency_key for nj in new_jobs):
            made = _NewJobs(tenant_id, given_instant(now))
            out: list[_Made] = []
            async with contextlib.aclosing(made.parts(new_jobs, out)) as parts:
                rows: NewJobRows | AsyncIterator[NewJobRows] = parts
                if len(new_jobs) <= _PART:
                    rows = await anext(parts)
                done = await self._alone(
                    self.driver.jobs_insert_alone(self.engine, tenant_id=tenant_id, rows=rows)
                )
                if done != "inserted":
                    async for _ in parts:  # the rest made: the answer and a limit's count
                        pass
            if done == "no_tenant":
                raise self._not_found("tenant", tenant_id)
            if done == "limited":
                async with self._write() as conn:
                    await self._jobs_insert_admitted(conn, tenant_id, made)
            return made, out
        async with self._write() as conn:
            return await self._jobs_create_in(conn, tenant_id, new_jobs, now)

    async def _jobs_create_in(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        new_jobs: Sequence[NewJob],
        now: datetime | None,
    ) -> tuple[_NewJobs, list[_Made]]:
        at = await self._now(conn, now)
        # Only a key's replay compares requests: a job without one needs no hash.
        hashes = [_request_hash(nj) if nj.idempotency_key else None for nj in new_jobs]
        replay = await self._jobs_replayed(conn, tenant_id, new_jobs, hashes)
        made = _NewJobs(tenant_id, at)
        out: list[_Made] = []
        for nj, h in zip(new_jobs, hashes, strict=True):
            if nj.idempotency_key and nj.idempotency_key in replay:
                job, run = replay[nj.idempotency_key]
                out.append(_Made(job, None if run is None else run.id, run, False))
            else:
                out.append(made.add(nj, h))
        if not made.jobs:
            return made, out
        rows = made.rows()
        done = await self.driver.jobs_insert(conn, tenant_id=tenant_id, rows=rows, admitted=False)
        if done == "no_tenant":
            raise self._not_found("tenant", tenant_id)
        if done == "limited":
            await self._jobs_insert_admitted(conn, tenant_id, made)
        return made, out

    async def _jobs_insert_admitted(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, made: _NewJobs
    ) -> None:
        """Insert ``made`` for a tenant with ``max_pending_runs``, once its count admits
        them (``store/sql/pending.py``), in ``conn``'s transaction."""
        limit = await tenant_for_new_runs(conn, tenant_id)
        await pending_admit(conn, tenant_id, limit=limit, adding=made.first_runs)
        await self.driver.jobs_insert(conn, tenant_id=tenant_id, rows=made.rows(), admitted=True)

    async def _jobs_replayed(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        new_jobs: Sequence[NewJob],
        hashes: Sequence[str | None],
    ) -> dict[str, tuple[Job, Run | None]]:
        """The jobs created before under the batch's idempotency keys, with their first
        runs; :class:`IdempotencyConflictError` when a key came with another request."""
        keys = [nj.idempotency_key for nj in new_jobs if nj.idempotency_key]
        replay: dict[str, tuple[Job, Run | None]] = {}
        if not keys:
            return replay
        rows = (
            await conn.execute(
                jobs.select().where(jobs.c.tenant_id == tenant_id, jobs.c.idempotency_key.in_(keys))
            )
        ).all()
        stored = {row.idempotency_key: row.request_hash for row in rows}
        # Each job's own request against the key's (one batch may name a key twice).
        for nj, h in zip(new_jobs, hashes, strict=True):
            if nj.idempotency_key in stored and stored[nj.idempotency_key] != h:
                raise IdempotencyConflictError(
                    "this Idempotency-Key was used with a different request",
                    field="Idempotency-Key",
                )
        for row in rows:
            first = (
                await conn.execute(
                    sa.select(*runs.c)
                    .where(runs.c.tenant_id == tenant_id, runs.c.job_id == row.id)
                    .order_by(runs.c.id)
                    .limit(1)
                )
            ).first()
            replay[row.idempotency_key] = (job_from(row), run_from(first) if first else None)
        return replay

    async def jobs_get(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> Job:
        async with self._read() as conn:
            row = (
                await conn.execute(
                    jobs_select().where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
                )
            ).first()
        if row is None:
            raise self._not_found("job", job_id)
        return job_from(row)

    async def jobs_list(
        self,
        tenant_id: uuid.UUID,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        workflows: bool | None = None,
    ) -> Page[Job]:
        before = uuid_cursor(cursor)
        stmt = jobs_select().where(jobs.c.tenant_id == tenant_id)
        if workflows is not None:  # only workflows, or only jobs
            stmt = stmt.where(
                jobs.c.workflow.is_not(None) if workflows else jobs.c.workflow.is_(None)
            )
        if state is not None:
            stmt = stmt.where(jobs.c.state == state)
        if tag is not None:
            stmt = stmt.where(self.driver.json_has(jobs.c.tags, tag))
        if name_prefix:
            stmt = stmt.where(self.driver.starts_with(jobs.c.name, name_prefix))
        if before is not None:
            stmt = stmt.where(jobs.c.id < before)
        stmt = stmt.order_by(jobs.c.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [job_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def jobs_cancel(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        by = name_of(actor)
        async with self._write() as conn:
            at = await self._now(conn, now)
            current = await self._job_with_runs(conn, tenant_id, job_id)
            if current.state not in (JobState.ACTIVE, JobState.PAUSED):
                raise IllegalTransitionError(
                    f"job {job_id} is {current.state.value} and cannot be cancelled",
                    source=current.state.value,
                    target=JobState.CANCELLED.value,
                )
            row = (
                await conn.execute(
                    jobs.update()
                    .where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
                    .values(
                        state=JobState.CANCELLED.value,
                        next_due_at=None,
                        updated_at=at,
                        version=jobs.c.version + 1,
                    )
                    .returning(*jobs.c)
                )
            ).one()
            events_out = [
                event_row(
                    at=at,
                    kind="job.cancelled",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=by,
                    reason=reason,
                )
            ]
            cancelled = await self._cancel_runs(
                conn,
                tenant_id,
                sa.and_(runs.c.job_id == job_id),
                at=at,
                actor=by,
                reason=reason or "job cancelled",
            )
            await self._insert_events(conn, events_out + cancelled)
            await self._audit_job_state(
                conn,
                actor,
                tenant_id,
                job_id,
                move=(current.state, JobState.CANCELLED),
                at=at,
                reason=reason,
                run_events=cancelled,
            )
        return job_from(row)

    async def jobs_pause(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        return await self._job_hold(
            tenant_id, job_id, pause=True, actor=actor, reason=reason, now=now
        )

    async def jobs_resume(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        return await self._job_hold(
            tenant_id, job_id, pause=False, actor=actor, reason=reason, now=now
        )

    async def _job_hold(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        pause: bool,
        actor: Actor | None,
        reason: str | None,
        now: datetime | None,
    ) -> Job:
        """Pause (or resume) one job: its runs held (or released), recorded."""
        move = (JobState.ACTIVE, JobState.PAUSED) if pause else (JobState.PAUSED, JobState.ACTIVE)
        by = name_of(actor)
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._job_move(conn, tenant_id, job_id, *move, at)
            moved = await self._jobs_flip(conn, tenant_id, [job_id], pause=pause, at=at, by=by)
            changed = event_row(
                at=at,
                kind="job.paused" if pause else "job.resumed",
                tenant_id=tenant_id,
                job_id=job_id,
                actor=by,
                reason=reason,
            )
            await self._insert_events(conn, [changed, *moved])
            await self._audit_job_state(
                conn,
                actor,
                tenant_id,
                job_id,
                move=move,
                at=at,
                reason=reason,
                run_events=moved,
            )
            return await self._job_read(conn, tenant_id, job_id)

    async def _audit_job_state(
        self,
        conn: AsyncConnection,
        actor: Actor | None,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        move: tuple[JobState, JobState],
        at: datetime,
        reason: str | None,
        run_events: Sequence[dict[str, Any]],
    ) -> None:
        """The audit record of a job moved from one state to another, with how many of
        its runs went where (``run_events``: the history the move appended for them)."""
        moved = Counter(
            e["to_state"] if e["kind"] == "run.transition" else e["kind"].removeprefix("run.")
            for e in run_events
        )
        source, target = move
        await self._audit(
            conn,
            actor,
            at=at,
            tenant_id=tenant_id,
            action=f"job.{_VERBS[target]}",
            target_kind="job",
            target_id=job_id,
            reason=reason,
            before={"state": source.value},
            after={"state": target.value, "runs": dict(moved)},
        )

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
        await self._lock_jobs_with_runs(conn, tenant_id, [job_id])
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
