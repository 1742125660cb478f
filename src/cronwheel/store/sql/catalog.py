"""Tenants, API keys, jobs, and the read and cancel side of runs."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import ConflictError, IdempotencyConflictError, IllegalTransitionError
from cronwheel.domain.model import Attempt, Event, Job, NewJob, Page, Run
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.spec import schedule_kind
from cronwheel.domain.states import ACTIVE_STATES, JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.base import RunFilter
from cronwheel.store.notices import CHANNEL_RUNS_NEW
from cronwheel.store.rows import (
    attempt_from,
    event_from,
    event_row,
    int_cursor,
    job_from,
    new_run_row,
    run_from,
    uuid_cursor,
)
from cronwheel.store.schema import attempts, events, jobs, runs, tenants
from cronwheel.store.sql.core import SqlCore, jobs_select

__all__ = [
    "ANNOUNCE_HORIZON",
    "ONE_OFF_KINDS",
    "CatalogMixin",
    "announce",
]

ONE_OFF_KINDS = ("at", "delay", "asap")
# Runs due this soon are announced to the schedulers at once (their window is shorter).
ANNOUNCE_HORIZON = timedelta(seconds=120)


def _request_hash(spec: Any) -> str:
    body = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def announce(run_id: uuid.UUID, shard: int, fire_at: datetime) -> str:
    """The payload of a CHANNEL_RUNS_NEW notification for one run."""
    return f"{shard}:{int(fire_at.timestamp() * 1000)}:{run_id.hex}"


class CatalogMixin(SqlCore):
    # -- jobs ----------------------------------------------------------------------

    async def jobs_create_many(
        self, tenant_id: uuid.UUID, *, jobs: Sequence[NewJob], now: datetime | None = None
    ) -> list[tuple[Job, Run | None, bool]]:
        # Two requests racing with one idempotency key: the loser's insert fails on the
        # unique key; on the second pass it finds the winner's job.
        for attempt in range(2):
            try:
                async with self._write() as conn:
                    return await self._jobs_create(conn, tenant_id, jobs, now)
            except IntegrityError as exc:
                if attempt == 1 or "idempotency" not in str(exc.orig).lower():
                    raise ConflictError(f"the jobs could not be stored: {exc.orig}") from None
        raise AssertionError("unreachable")

    async def _jobs_create(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        new_jobs: Sequence[NewJob],
        now: datetime | None,
    ) -> list[tuple[Job, Run | None, bool]]:
        at = await self._now(conn, now)
        exists = (
            await conn.execute(sa.select(tenants.c.id).where(tenants.c.id == tenant_id))
        ).first()
        if exists is None:
            raise self._not_found("tenant", tenant_id)
        hashes = [_request_hash(nj.spec) for nj in new_jobs]
        keys = [nj.idempotency_key for nj in new_jobs if nj.idempotency_key]
        replay: dict[str, tuple[Job, Run | None]] = {}
        if keys:
            rows = (
                await conn.execute(
                    jobs.select().where(
                        jobs.c.tenant_id == tenant_id, jobs.c.idempotency_key.in_(keys)
                    )
                )
            ).all()
            by_key = {nj.idempotency_key: h for nj, h in zip(new_jobs, hashes, strict=True)}
            for row in rows:
                if by_key.get(row.idempotency_key) != row.request_hash:
                    raise IdempotencyConflictError(
                        "this Idempotency-Key was used with a different request",
                        field="Idempotency-Key",
                    )
                first = (
                    await conn.execute(
                        sa.select(*runs.c)
                        .where(runs.c.tenant_id == tenant_id, runs.c.job_id == row.id)
                        .order_by(runs.c.id)
                        .limit(1)
                    )
                ).first()
                replay[row.idempotency_key] = (job_from(row), run_from(first) if first else None)
        job_rows: list[dict[str, Any]] = []
        run_rows: list[dict[str, Any]] = []
        skipped_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        out: list[tuple[uuid.UUID, uuid.UUID | None] | tuple[Job, Run | None]] = []
        notices: list[str] = []
        for nj, h in zip(new_jobs, hashes, strict=True):
            if nj.idempotency_key and nj.idempotency_key in replay:
                out.append(replay[nj.idempotency_key])
                continue
            spec = nj.spec
            job_id = new_id()
            kind = schedule_kind(spec.schedule)
            template = spec.model_dump(mode="json", exclude={"name", "schedule"})
            job_rows.append(
                {
                    "id": job_id,
                    "tenant_id": tenant_id,
                    "name": spec.name,
                    "state": JobState.ACTIVE.value,
                    "kind": kind,
                    "schedule": spec.schedule.model_dump(mode="json"),
                    "template": template,
                    "tags": list(spec.tags),
                    "version": 1,
                    "next_due_at": nj.first_due_at,
                    "idempotency_key": nj.idempotency_key,
                    "request_hash": h,
                    "created_at": at,
                    "updated_at": at,
                }
            )
            event_rows.append(
                event_row(
                    at=at,
                    kind="job.created",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=nj.actor,
                    data={"name": spec.name, "schedule": kind},
                )
            )
            run_id: uuid.UUID | None = None
            shard = shard_of(tenant_id, job_id)
            for skip in nj.skipped:
                skipped_id = new_id()
                skipped_rows.append(
                    new_run_row(
                        run_id=skipped_id,
                        tenant_id=tenant_id,
                        job_id=job_id,
                        name=spec.name,
                        template=template,
                        due_at=skip.due_at,
                        due_local=skip.due_local,
                        shard=shard,
                        at=at,
                        origin="schedule",
                        state=RunState.SKIPPED,
                    )
                    | {"reason": skip.reason, "finished_at": at}
                )
                # Created SCHEDULED and skipped at once, as the scheduler records the
                # occurrences it skips: every history starts in SCHEDULED.
                event_rows += [
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=tenant_id,
                        job_id=job_id,
                        run_id=skipped_id,
                        from_state=source,
                        to_state=target.value,
                        actor=nj.actor,
                        reason=skip.reason,
                    )
                    for source, target in (
                        (None, RunState.SCHEDULED),
                        (RunState.SCHEDULED.value, RunState.SKIPPED),
                    )
                ]
            if nj.first_due_at is not None:
                run_id = new_id()
                run_rows.append(
                    new_run_row(
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
                    )
                )
                event_rows.append(
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=tenant_id,
                        job_id=job_id,
                        run_id=run_id,
                        to_state=RunState.SCHEDULED.value,
                        actor=nj.actor,
                        reason="job created",
                    )
                )
                if nj.first_due_at < at + ANNOUNCE_HORIZON:
                    notices.append(announce(run_id, shard, nj.first_due_at))
            out.append((job_id, run_id))
        if job_rows:
            await conn.execute(jobs.insert(), job_rows)
        for new_runs in (run_rows, skipped_rows):
            if new_runs:
                await conn.execute(runs.insert(), new_runs)
        await self._insert_events(conn, event_rows)
        if notices:
            await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        return await self._created(conn, tenant_id, out, [r["id"] for r in run_rows])

    async def _created(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        out: list[tuple[uuid.UUID, uuid.UUID | None] | tuple[Job, Run | None]],
        first_runs: list[uuid.UUID],
    ) -> list[tuple[Job, Run | None, bool]]:
        new_ids = [item[0] for item in out if isinstance(item[0], uuid.UUID)]
        job_map: dict[uuid.UUID, Job] = {}
        run_map: dict[uuid.UUID, Run] = {}
        if new_ids:
            for row in await conn.execute(
                jobs.select().where(self.driver.id_in(jobs.c.id, new_ids))
            ):
                job_map[row.id] = job_from(row)
            if first_runs:
                stmt = sa.select(*runs.c).where(self.driver.id_in(runs.c.id, first_runs))
                for row in await conn.execute(stmt):
                    run_map[row.job_id] = run_from(row)
        result: list[tuple[Job, Run | None, bool]] = []
        for item in out:
            if isinstance(item[0], Job):
                job, run = item[0], item[1]
                result.append((job, run if isinstance(run, Run) else None, False))
            else:
                job_id = item[0]
                result.append((job_map[job_id], run_map.get(job_id), True))
        return result

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
    ) -> Page[Job]:
        before = uuid_cursor(cursor)
        stmt = jobs_select().where(jobs.c.tenant_id == tenant_id)
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
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._lock_live_runs(conn, tenant_id, runs.c.job_id == job_id)
            row = (
                await conn.execute(
                    jobs.update()
                    .where(
                        jobs.c.tenant_id == tenant_id,
                        jobs.c.id == job_id,
                        jobs.c.state.in_([JobState.ACTIVE.value, JobState.PAUSED.value]),
                    )
                    .values(
                        state=JobState.CANCELLED.value,
                        next_due_at=None,
                        updated_at=at,
                        version=jobs.c.version + 1,
                    )
                    .returning(*jobs.c)
                )
            ).first()
            if row is None:
                current = await self.jobs_get(tenant_id, job_id)  # raises NotFoundError
                raise IllegalTransitionError(
                    f"job {job_id} is {current.state.value} and cannot be cancelled",
                    source=current.state.value,
                    target=JobState.CANCELLED.value,
                )
            events_out = [
                event_row(
                    at=at,
                    kind="job.cancelled",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=actor,
                    reason=reason,
                )
            ]
            events_out += await self._cancel_runs(
                conn,
                tenant_id,
                sa.and_(runs.c.job_id == job_id),
                at=at,
                actor=actor,
                reason=reason or "job cancelled",
            )
            await self._insert_events(conn, events_out)
        return job_from(row)

    # -- runs ----------------------------------------------------------------------

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
        actor: str | None = None,
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
                actor=actor,
                reason=reason or "cancelled by request",
            )
            await self._insert_events(conn, rows)
            row = (await conn.execute(sa.select(*runs.c).where(runs.c.id == run_id))).one()
        return run_from(row)

    async def runs_count_by_state(self) -> dict[str, int]:
        async with self._read() as conn:
            rows = (
                await conn.execute(sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state))
            ).all()
        counts = {s.value: 0 for s in RunState}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    # -- history -------------------------------------------------------------------

    async def attempts_list(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID) -> list[Attempt]:
        async with self._read() as conn:
            rows = (
                await conn.execute(
                    attempts.select()
                    .where(attempts.c.tenant_id == tenant_id, attempts.c.run_id == run_id)
                    .order_by(attempts.c.number)
                )
            ).all()
        return [attempt_from(r) for r in rows]

    async def attempts_get(self, attempt_id: uuid.UUID) -> Attempt:
        async with self._read() as conn:
            row = (await conn.execute(attempts.select().where(attempts.c.id == attempt_id))).first()
        if row is None:
            raise self._not_found("attempt", attempt_id)
        return attempt_from(row)

    async def events_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        run_id: uuid.UUID | None = None,
        job_id: uuid.UUID | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Event]:
        after = int_cursor(cursor)
        stmt = events.select()
        if tenant_id is not None:
            stmt = stmt.where(events.c.tenant_id == tenant_id)
        if run_id is not None:
            stmt = stmt.where(events.c.run_id == run_id)
        if job_id is not None:
            stmt = stmt.where(events.c.job_id == job_id)
        if after is not None:
            stmt = stmt.where(events.c.id > after)
        stmt = stmt.order_by(events.c.id).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [event_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def events_transitions(self) -> dict[tuple[str | None, str], int]:
        stmt = (
            sa.select(events.c.from_state, events.c.to_state, sa.func.count())
            .where(events.c.kind == "run.transition")
            .group_by(events.c.from_state, events.c.to_state)
        )
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return {(r[0], r[1]): int(r[2]) for r in rows}
