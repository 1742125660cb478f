"""Runtime parameter overrides (``domain/overrides.py``): made, listed and removed.

Making or removing one changes the runs it reaches in the same transaction
(``overlay.py``): the job's unstarted runs are locked first, then the job, as every
path that changes runs and their job takes them, so a scheduler firing the job's next
run, a worker leasing it and the override go one after the other, never past each
other. A run a node holds in its due window is only an id there: firing and leasing
read the row, so they find the override. A run reserved by a worker ahead of its
instant has its reservation voided (the worker was handed the old payload): its start
is refused and the run is leased again, with the new fields.

A ``run`` or ``next`` override is consumed when its run starts or ends without
starting; nothing is written then — its status is read from its run.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import ConflictError, IllegalTransitionError, ValidationError
from cronwheel.domain.model import Job
from cronwheel.domain.overrides import MAX_ACTIVE, Override, OverrideScope, merge_order
from cronwheel.domain.states import JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.notices import CHANNEL_RUNS_READY, ready_notices
from cronwheel.store.rows import event_row
from cronwheel.store.schema import jobs, overrides, runs
from cronwheel.store.sql.jobs import JobsMixin
from cronwheel.store.sql.overlay import (
    UNSTARTED,
    Reached,
    job_overlay_written,
    override_from,
    runs_overlaid,
)

__all__ = ["OverridesMixin"]

_UNSTARTED_STATES = (RunState.SCHEDULED.value, RunState.DISPATCHED.value)


def _status(row: Any) -> str:
    """active, consumed or removed (see the module docstring); ``row`` has the bound
    run's ``run_state`` and ``run_attempt`` (None: no run, or gone)."""
    if row.removed_at is not None:
        return "removed"
    if row.scope == OverrideScope.FUTURE.value:
        return "active"
    if row.run_state in _UNSTARTED_STATES and row.run_attempt == 0:
        return "active"
    return "consumed"


def _with_run() -> sa.Select[Any]:
    return sa.select(
        overrides, runs.c.state.label("run_state"), runs.c.attempt.label("run_attempt")
    ).select_from(
        overrides.outerjoin(
            runs,
            sa.and_(runs.c.tenant_id == overrides.c.tenant_id, runs.c.id == overrides.c.run_id),
        )
    )


def _described(o: Override) -> dict[str, Any]:
    """What the history and the audit trail keep of an override: the payload patch's
    keys only (values may be secrets), as a trigger's payload."""
    described: dict[str, Any] = {"override_id": str(o.id), "scope": o.scope.value}
    if o.run_id is not None:
        described["run_id"] = str(o.run_id)
    if o.payload is not None:
        described["payload_keys"] = sorted(o.payload)
    for name in ("timeout", "priority", "pool"):
        value = getattr(o, name)
        if value is not None:
            described[name] = value
    return described


class OverridesMixin(JobsMixin):
    async def overrides_create(
        self,
        tenant_id: uuid.UUID,
        *,
        scope: OverrideScope,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        payload: dict[str, Any] | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        pool: str | None = None,
        reason: str | None = None,
        actor: Actor | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> tuple[Override, list[uuid.UUID]]:
        if (scope is OverrideScope.RUN) != (run_id is not None):
            raise ValidationError("a run override names its run; a job's names none")
        if not payload and timeout is None and priority is None and pool is None:
            # An empty payload patch is no change either: accepted, it would be listed
            # as changing runs it leaves as they were.
            raise ValidationError(
                "the override changes nothing: give at least one of payload (a non-empty "
                "patch), timeout, priority, pool"
            )
        async with self._write() as conn:
            at = await self._now(conn, now)
            if run_id is not None:
                job_id = await self._job_of_run(conn, tenant_id, run_id)
            assert job_id is not None
            job = await self._job_with_runs(conn, tenant_id, job_id)
            if scope is OverrideScope.RUN:
                assert run_id is not None
                where = await self._run_target(conn, tenant_id, run_id, timeout)
            else:
                run_id, where = await self._job_target(conn, job, scope, timeout)
            await self._check_room(conn, job)
            override = Override(
                id=new_id(),
                tenant_id=tenant_id,
                job_id=job.id,
                run_id=run_id,
                scope=scope,
                payload=payload,
                timeout=timeout,
                priority=priority,
                pool=pool,
                reason=reason,
                created_by=name_of(actor),
                created_at=at,
            )
            await conn.execute(
                overrides.insert().values(
                    id=override.id,
                    tenant_id=tenant_id,
                    job_id=job.id,
                    run_id=run_id,
                    scope=scope.value,
                    payload=payload,
                    timeout=timeout,
                    priority=priority,
                    pool=pool,
                    reason=reason,
                    created_by=override.created_by,
                    created_at=at,
                )
            )
            reached = await runs_overlaid(
                conn,
                self.driver,
                tenant_id,
                where,
                add=[override],
                max_payload_bytes=max_payload_bytes,
            )
            if scope is OverrideScope.FUTURE:
                await job_overlay_written(conn, job, max_payload_bytes=max_payload_bytes)
            await self._overlay_told(
                conn, job, override, reached, at=at, actor=actor, reason=reason, added=True
            )
        return override, reached.ids

    async def overrides_remove(
        self,
        tenant_id: uuid.UUID,
        override_id: uuid.UUID,
        *,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        actor: Actor | None = None,
        reason: str | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> tuple[Override, list[uuid.UUID]]:
        async with self._write() as conn:
            at = await self._now(conn, now)
            found = await self._override(conn, tenant_id, override_id, job_id, run_id)
            job = await self._job_with_runs(conn, tenant_id, found.job_id)
            found = await self._override(conn, tenant_id, override_id, job_id, run_id)
            if found.status != "active":
                raise ConflictError(
                    f"override {override_id} is {found.status}"
                    + (
                        f": its run {found.run_id} started or ended with it, and keeps it"
                        if found.status == "consumed"
                        else ""
                    ),
                    override_id=str(override_id),
                    status=found.status,
                )
            await conn.execute(
                overrides.update()
                .where(overrides.c.id == override_id)
                .values(removed_at=at, removed_by=name_of(actor))
            )
            where = runs.c.job_id == job.id if found.run_id is None else runs.c.id == found.run_id
            # Removing one override can make the others' payload larger (one that
            # dropped a key no longer does): held to the limit as a new one is.
            reached = await runs_overlaid(
                conn, self.driver, tenant_id, sa.and_(where, runs.c.overrides.is_not(None)),
                remove=override_id, max_payload_bytes=max_payload_bytes,
            )  # fmt: skip
            if found.scope is OverrideScope.FUTURE:
                await job_overlay_written(conn, job, max_payload_bytes=max_payload_bytes)
            await self._overlay_told(
                conn, job, found, reached, at=at, actor=actor, reason=reason, added=False
            )
            removed = await self._override(conn, tenant_id, override_id, None, None)
        return removed, reached.ids

    async def overrides_list(
        self,
        tenant_id: uuid.UUID,
        *,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        ended: bool = False,
    ) -> list[Override]:
        """A job's overrides, or those of a run: what made it (its ``override_ids``)
        and any bound to it. Only the active ones unless ``ended``; in the merge order
        within each status."""
        async with self._read() as conn:
            if run_id is not None:
                row = (
                    await conn.execute(
                        sa.select(runs.c.overrides).where(
                            runs.c.tenant_id == tenant_id, runs.c.id == run_id
                        )
                    )
                ).first()
                if row is None:
                    raise self._not_found("run", run_id)
                made = [uuid.UUID(i) for i in (row.overrides or {}).get("ids", [])]
                which = sa.or_(
                    overrides.c.run_id == run_id, self.driver.id_in(overrides.c.id, made)
                )
            else:
                assert job_id is not None
                found_job = (
                    await conn.execute(
                        sa.select(jobs.c.id).where(
                            jobs.c.tenant_id == tenant_id, jobs.c.id == job_id
                        )
                    )
                ).first()
                if found_job is None:
                    raise self._not_found("job", job_id)
                which = overrides.c.job_id == job_id
            rows = await conn.execute(_with_run().where(overrides.c.tenant_id == tenant_id, which))
            found = [override_from(r, _status(r)) for r in rows]
        return merge_order(o for o in found if ended or o.status == "active")

    async def overrides_get(self, tenant_id: uuid.UUID, override_id: uuid.UUID) -> Override:
        async with self._read() as conn:
            return await self._override(conn, tenant_id, override_id, None, None)

    # -- steps ---------------------------------------------------------------------

    async def _override(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        override_id: uuid.UUID,
        job_id: uuid.UUID | None,
        run_id: uuid.UUID | None,
    ) -> Override:
        """The override, its status read; not found unless it is the tenant's and,
        when given, of ``job_id`` or bound to ``run_id``."""
        row = (
            await conn.execute(
                _with_run().where(overrides.c.tenant_id == tenant_id, overrides.c.id == override_id)
            )
        ).first()
        if (
            row is None
            or (job_id is not None and row.job_id != job_id)
            or (run_id is not None and row.run_id != run_id)
        ):
            raise self._not_found("override", override_id)
        return override_from(row, _status(row))

    async def _job_of_run(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, run_id: uuid.UUID
    ) -> uuid.UUID:
        job_id = (
            await conn.execute(
                sa.select(runs.c.job_id).where(runs.c.tenant_id == tenant_id, runs.c.id == run_id)
            )
        ).scalar()
        if job_id is None:
            raise self._not_found("run", run_id)
        return uuid.UUID(str(job_id))

    async def _run_target(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        timeout: float | None,
    ) -> sa.ColumnElement[bool]:
        """The run a ``run`` override reaches, or why it cannot (409: it started)."""
        row = (
            await conn.execute(
                sa.select(runs.c.state, runs.c.attempt, runs.c.progress_timeout).where(
                    runs.c.tenant_id == tenant_id, runs.c.id == run_id
                )
            )
        ).one()
        if row.state not in _UNSTARTED_STATES or row.attempt > 0:
            tried = f" and was tried {row.attempt} times" if row.attempt else ""
            raise ConflictError(
                f"run {run_id} is {row.state}{tried}: an override reaches only a run that "
                "has not started (a started run keeps what it started with); override the "
                "job's next or future runs instead",
                run_id=str(run_id),
                run_state=row.state,
            )
        _check_timeout(timeout, row.progress_timeout)
        return runs.c.id == run_id

    async def _job_target(
        self, conn: AsyncConnection, job: Job, scope: OverrideScope, timeout: float | None
    ) -> tuple[uuid.UUID | None, sa.ColumnElement[bool]]:
        """The run a ``next`` override is bound to and the runs a job's override
        reaches now."""
        if job.state in (JobState.CANCELLED, JobState.FINISHED):
            raise IllegalTransitionError(
                f"job {job.id} is {job.state.value}: it makes no more runs to override",
                source=job.state.value,
                target="overridden",
            )
        _check_timeout(timeout, job.template.progress_timeout)
        of_job = sa.and_(runs.c.tenant_id == job.tenant_id, runs.c.job_id == job.id)
        if scope is OverrideScope.FUTURE:
            return None, runs.c.job_id == job.id
        following = (
            await conn.execute(
                sa.select(runs.c.id)
                .where(of_job, UNSTARTED, runs.c.origin.in_(("once", "schedule")))
                .order_by(runs.c.due_at)
                .limit(1)
            )
        ).scalar()
        if following is None:
            raise ConflictError(
                f"job {job.id} has no occurrence to come that has not started: its next "
                "run is running or done; override its future runs instead",
                job_id=str(job.id),
            )
        return following, runs.c.id == following

    async def _check_room(self, conn: AsyncConnection, job: Job) -> None:
        rows = await conn.execute(
            _with_run().where(
                overrides.c.tenant_id == job.tenant_id,
                overrides.c.job_id == job.id,
                overrides.c.removed_at.is_(None),
            )
        )
        active = sum(1 for r in rows if _status(r) == "active")
        if active >= MAX_ACTIVE:
            raise ConflictError(
                f"job {job.id} has {active} overrides on, the most one job may have: "
                "remove some, or make the lasting ones part of the job (PATCH /v1/jobs/{id})",
                job_id=str(job.id),
                limit=MAX_ACTIVE,
            )

    async def _overlay_told(
        self,
        conn: AsyncConnection,
        job: Job,
        override: Override,
        reached: Reached,
        *,
        at: datetime,
        actor: Actor | None,
        reason: str | None,
        added: bool,
    ) -> None:
        """The history, the audit record and the ready notices of a change of overrides."""
        by = name_of(actor)
        described = _described(override)
        kind = "override.added" if added else "override.removed"
        rows = [
            event_row(
                at=at,
                kind=kind,
                tenant_id=job.tenant_id,
                job_id=job.id,
                run_id=override.run_id,
                actor=by,
                reason=reason,
                data={**described, "runs": len(reached.ids)},
            )
        ]
        rows += [
            event_row(
                at=at,
                kind="run.overridden",
                tenant_id=job.tenant_id,
                job_id=job.id,
                run_id=run_id,
                actor=by,
                reason=reason,
                data={("added" if added else "removed"): str(override.id)},
            )
            for run_id in reached.ids
        ]
        await self._insert_events(conn, rows)
        target_kind, target_id = (
            ("run", override.run_id) if override.scope is OverrideScope.RUN else ("job", job.id)
        )
        await self._audit(
            conn,
            actor,
            at=at,
            tenant_id=job.tenant_id,
            action="override.add" if added else "override.remove",
            target_kind=target_kind,
            target_id=target_id,
            reason=reason,
            before=None if added else {**described, "status": "active"},
            after=(
                {**described, "runs": [str(i) for i in reached.ids]}
                if added
                else {"status": "removed", "runs": [str(i) for i in reached.ids]}
            ),
        )
        if reached.ready:
            await self._notify(conn, CHANNEL_RUNS_READY, ready_notices(reached.ready, at))


def _check_timeout(timeout: float | None, progress_timeout: float | None) -> None:
    if timeout is not None and progress_timeout is not None and timeout < progress_timeout:
        raise ValidationError(
            f"timeout: must be at least the runs' progress_timeout ({progress_timeout:g} s)",
            field="timeout",
        )
