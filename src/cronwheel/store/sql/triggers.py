"""Runs made on request, beside a job's schedule: trigger now, and backfill of a past
range (spaced by a rate, chunked so no statement grows with the range)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.bounds import BACKFILL_RATE_MAX, BACKFILL_RATE_MIN
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.model import Job, Run
from cronwheel.domain.new_job import check_json_size
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.spec import (
    CronSchedule,
    IntervalSchedule,
)
from cronwheel.domain.states import JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import event_row, new_run_row, run_from
from cronwheel.store.schema import runs
from cronwheel.store.sql.jobs import JobsMixin, stored_schedule
from cronwheel.store.sql.overlay import future_overrides, overlaid_rows
from cronwheel.store.sql.pending import pending_admit, tenant_for_new_runs
from cronwheel.timing import due_local, iter_occurrences

__all__ = ["TriggersMixin"]


# Two triggers in the same microsecond would collide on UNIQUE(tenant, job, due_at):
# the later one takes the next free microsecond, within this many.
_TRIGGER_SLOTS = 1000


# Rows per INSERT: under the bind-parameter limits of asyncpg and SQLite.
_INSERT_CHUNK = 500


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


class TriggersMixin(JobsMixin):
    async def jobs_trigger(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        payload: dict[str, Any] | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> Run:
        async with self._write() as conn:
            at = await self._now(conn, now)
            # The tenant before the job: the order of creating jobs and of a deletion.
            max_pending = await tenant_for_new_runs(conn, tenant_id)
            job = await self._job_for_update(conn, tenant_id, job_id)
            if job.state is JobState.CANCELLED:
                raise IllegalTransitionError(
                    f"job {job_id} is cancelled and cannot be triggered",
                    source=job.state.value,
                    target="triggered",
                )
            await pending_admit(conn, tenant_id, limit=max_pending, adding=1)
            run = await self._trigger_run(
                conn,
                tenant_id,
                job,
                at=at,
                by=name_of(actor),
                payload=payload,
                max_payload_bytes=max_payload_bytes,
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="job.trigger",
                target_kind="job",
                target_id=job_id,
                # The payload's keys, as the history has them: values may be secrets.
                after={"run_id": run.id, "payload_keys": sorted(payload or {})},
            )
        return run

    async def _trigger_run(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        job: Job,
        *,
        at: datetime,
        by: str | None,
        payload: dict[str, Any] | None = None,
        reason: str = "triggered",
        max_payload_bytes: int | None = None,
    ) -> Run:
        """A run of ``job`` (locked, not cancelled, admitted) due ``at``, with ``payload``
        merged over the job's, then the job's ``future`` overrides: recorded and announced.
        ``max_payload_bytes``: the run's payload, so made, must be within it."""
        template = job.template.with_payload(payload)
        schedule = stored_schedule(job.kind, job.schedule)
        shard = shard_of(tenant_id, job.id)
        run_id = new_id()
        futures = await future_overrides(conn, job) if job.overlay else []
        for slot in range(_TRIGGER_SLOTS):
            due = at + timedelta(microseconds=slot)
            row = new_run_row(
                run_id=run_id,
                tenant_id=tenant_id,
                job_id=job.id,
                name=job.name,
                template=template,
                due_at=due,
                due_local=due_local(schedule, due),
                shard=shard,
                at=at,
                origin="trigger",
            )
            overlaid_rows([row], futures)
            if max_payload_bytes is not None and payload:
                check_json_size(row["payload"], limit=max_payload_bytes, field="payload")
            await conn.execute(self.driver.insert_ignore(runs, [row]))
            created = await self._runs_by_id(conn, tenant_id, [run_id])
            if created:
                break
        else:
            raise IllegalTransitionError(
                f"job {job.id} has a run due at every microsecond of the next "
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
                    job_id=job.id,
                    run_id=run.id,
                    actor=by,
                    data={"payload_keys": sorted(payload or {})},
                ),
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=tenant_id,
                    job_id=job.id,
                    run_id=run.id,
                    to_state=RunState.SCHEDULED.value,
                    actor=by,
                    reason=reason,
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
        actor: Actor | None = None,
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
            max_pending = await tenant_for_new_runs(conn, tenant_id)
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
            overlaid_rows(rows, await future_overrides(conn, job) if job.overlay else [])
            for chunk in _chunks(rows):
                await conn.execute(self.driver.insert_ignore(runs, chunk))
            # An occurrence that already had a run kept it: what exists under the new
            # ids is exactly what this call created.
            created = await self._runs_by_id(conn, tenant_id, [r["id"] for r in rows])
            await pending_admit(
                conn, tenant_id, limit=max_pending, adding=len(created), counted=True
            )
            backfilled = {
                "from": start.astimezone(UTC).isoformat(),
                "to": end.astimezone(UTC).isoformat(),
                "occurrences": len(found),
                "created": len(created),
                "rate": rate,
            }
            out = [
                event_row(
                    at=at,
                    kind="job.backfilled",
                    tenant_id=tenant_id,
                    job_id=job_id,
                    actor=name_of(actor),
                    data=backfilled,
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
                    actor=name_of(actor),
                    reason="backfill",
                )
                for run in created
            ]
            await self._insert_events(conn, out)
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="job.backfill",
                target_kind="job",
                target_id=job_id,
                after=backfilled,
            )
            notices = [
                announce(run.id, shard, run.fire_at)
                for run in created
                if run.fire_at < at + ANNOUNCE_HORIZON
            ]
            if notices:
                await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        return created

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
