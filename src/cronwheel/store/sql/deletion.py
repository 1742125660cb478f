"""Deleting jobs and tenants, with everything they own.

What goes and what stays::

    jobs_delete      the job, its runs, their attempts and their run events
    tenants_delete   the tenant, its API keys, workers, jobs, runs, attempts, run events
    stays            every event not tied to a run (``job.created``, ``job.cancelled``,
                     ``tenant.created`` …) and the deletion's own ``job.deleted`` /
                     ``tenant.deleted`` event (who, when, why, what); and the audit
                     trail, which only retention shortens (``domain/audit.py``)

The rule an operator expects: what is still going is not deleted by accident. A job
with a run in progress (DISPATCHED or RUNNING) is refused (:class:`InUseError`, naming
the runs), and so is a tenant with a job still active or paused or a run in progress,
unless ``force``: then the runs in progress end with the deletion. A worker still
running one of them learns it from its next call about the attempt, refused as stale
(409, ``stale_fencing_token``) because the attempt's id is kept as a *tombstone*
(``attempt_tombstones``): nothing it reports can bring a row back. Tombstones are
purged after :data:`TOMBSTONE_TTL`, longer than any attempt may run.

Cancelling a job does not delete it: a cancelled job's history stays readable until
someone deletes it.

Worker log lines are not in the database: the caller deletes them from its log store
(``JobDeleted.attempted`` names the runs that have some).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.bounds import TIMEOUT_MAX
from cronwheel.domain.errors import InUseError, StoreUnavailableError
from cronwheel.domain.states import AttemptState, JobState, RunState
from cronwheel.store.notices import CHANNEL_KEYS_REVOKED, key_revoked
from cronwheel.store.rows import event_row
from cronwheel.store.schema import (
    api_keys,
    attempt_tombstones,
    attempts,
    events,
    fair_shares,
    jobs,
    rate_buckets,
    runs,
    tenants,
    workers,
)
from cronwheel.store.sql.core import Retake, SqlCore
from cronwheel.store.values import JobDeleted, TenantDeleted

__all__ = ["IN_PROGRESS", "TOMBSTONE_TTL", "DeletionMixin"]

# Runs a deletion without ``force`` refuses to end.
IN_PROGRESS = (RunState.DISPATCHED.value, RunState.RUNNING.value)

# How long a deleted attempt's id is refused as stale: longer than the longest attempt.
TOMBSTONE_TTL = timedelta(seconds=TIMEOUT_MAX) + timedelta(days=1)

# How many runs' attempts and events a deletion removes per statement (SQLite's bound on
# a statement's parameters is 32,766).
_CHUNK = 10_000
# How many times a deletion takes its tenant's runs and row, one waited for and the other
# not (``_tenant_after_runs``), backing off from 5 ms to 250 ms between tries (about 10 s).
_TENANT_TRIES = 48

# How many of the runs or jobs in the way an error's message names (its details list up
# to 100).
_NAMED = 10


def _listing(items: list[tuple[Any, str]], noun: str, what: str) -> str:
    """``2 runs in progress: <id> (RUNNING), <id> (DISPATCHED)``, naming the first few."""
    total = len(items)
    shown = ", ".join(f"{ident} ({state})" for ident, state in items[:_NAMED])
    more = f" and {total - _NAMED} more" if total > _NAMED else ""
    return f"{total} {noun}{'s' if total != 1 else ''} {what}: {shown}{more}"


def _ids(where: sa.ColumnElement[bool]) -> Any:
    """The ids of the runs ``where`` selects, as a subquery."""
    return sa.select(runs.c.id).where(where).scalar_subquery()


class DeletionMixin(SqlCore):
    async def jobs_delete(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        force: bool = False,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> JobDeleted:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await self._lock_jobs_with_runs(conn, tenant_id, [job_id])
            job = await self._job_locked(conn, tenant_id, job_id)
            of_job = sa.and_(runs.c.tenant_id == tenant_id, runs.c.job_id == job_id)
            stopped = await self._in_progress(conn, of_job)
            if stopped and not force:
                what = "workflow" if job.is_dag else "job"
                raise InUseError(
                    f"{what} {job_id} has {_listing(stopped, 'run', 'in progress')}; cancel "
                    f"the {what} and let them finish, or force the deletion (force=true) to "
                    "end them now",
                    field="force",
                    runs=[{"id": str(i), "state": s} for i, s in stopped[:100]],
                    count=len(stopped),
                )
            await self._bury_attempts(conn, tenant_id, of_job, at)
            attempted, count = await self._delete_runs(conn, tenant_id, of_job)
            await conn.execute(
                jobs.delete().where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
            )
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="job.deleted",
                        tenant_id=tenant_id,
                        job_id=job_id,
                        actor=name_of(actor),
                        reason=reason,
                        data={
                            "name": job.name,
                            "state": job.state,
                            "role": actor and actor.role,
                            "force": force,
                            "runs": count,
                            "stopped": [{"id": str(i), "state": s} for i, s in stopped[:100]],
                        },
                    )
                ],
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="job.delete",
                target_kind="job",
                target_id=job_id,
                reason=reason,
                before={"name": job.name, "state": job.state},
                after={"force": force, "runs_deleted": count, "runs_stopped": len(stopped)},
            )
        return JobDeleted(
            id=job_id, name=job.name, at=at, runs=count, stopped=stopped, attempted=attempted
        )

    async def tenants_delete(
        self,
        tenant_id: uuid.UUID,
        *,
        force: bool = False,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> TenantDeleted:
        async with self._write() as conn:
            at = await self._now(conn, now)
            tenant = await self._tenant_after_runs(conn, tenant_id)
            if tenant is None:
                raise self._not_found("tenant", tenant_id)
            live_jobs = [
                (r.id, r.state)
                for r in await conn.execute(
                    sa.select(jobs.c.id, jobs.c.state)
                    .where(
                        jobs.c.tenant_id == tenant_id,
                        jobs.c.state.in_([JobState.ACTIVE.value, JobState.PAUSED.value]),
                    )
                    .order_by(jobs.c.id)
                )
            ]
            of_tenant = runs.c.tenant_id == tenant_id
            stopped = await self._in_progress(conn, of_tenant)
            if (live_jobs or stopped) and not force:
                blocking = []
                if live_jobs:
                    blocking.append(_listing(live_jobs, "job", "not over"))
                if stopped:
                    blocking.append(_listing(stopped, "run", "in progress"))
                raise InUseError(
                    f"tenant {tenant_id} has {'; and '.join(blocking)}; cancel its jobs and "
                    "let their runs finish, or force the deletion (force=true)",
                    field="force",
                    jobs=[{"id": str(i), "state": s} for i, s in live_jobs[:100]],
                    runs=[{"id": str(i), "state": s} for i, s in stopped[:100]],
                )
            await self._bury_attempts(conn, tenant_id, of_tenant, at)
            _none, run_count = await self._delete_runs(conn, tenant_id, of_tenant, whole=True)
            counts = {}
            for name, table in (("jobs", jobs), ("workers", workers)):
                result = await conn.execute(table.delete().where(table.c.tenant_id == tenant_id))
                counts[name] = result.rowcount
            keys = (
                (
                    await conn.execute(
                        api_keys.delete()
                        .where(api_keys.c.tenant_id == tenant_id)
                        .returning(api_keys.c.id)
                    )
                )
                .scalars()
                .all()
            )
            counts["api_keys"] = len(keys)
            # Its keys stop at once on every API node, as a revoked key does.
            if keys:
                await self._notify(conn, CHANNEL_KEYS_REVOKED, [key_revoked(k) for k in keys])
            # Its admission state: fair-share passes, its dispatch and key rate buckets.
            await conn.execute(fair_shares.delete().where(fair_shares.c.tenant_id == tenant_id))
            buckets = [f"dispatch:{tenant_id}", *(f"api:{k}" for k in keys)]
            await conn.execute(rate_buckets.delete().where(rate_buckets.c.name.in_(buckets)))
            await conn.execute(tenants.delete().where(tenants.c.id == tenant_id))
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="tenant.deleted",
                        tenant_id=tenant_id,
                        actor=name_of(actor),
                        reason=reason,
                        data={
                            "name": tenant.name,
                            "role": actor and actor.role,
                            "force": force,
                            "runs": run_count,
                            **counts,
                        },
                    )
                ],
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="tenant.delete",
                target_kind="tenant",
                target_id=tenant_id,
                reason=reason,
                before={"name": tenant.name},
                after={"force": force, "runs_deleted": run_count, **counts},
            )
        return TenantDeleted(
            id=tenant_id,
            name=tenant.name,
            at=at,
            jobs=counts["jobs"],
            runs=run_count,
            stopped=stopped,
            api_keys=counts["api_keys"],
            workers=counts["workers"],
        )

    async def _tenant_after_runs(self, conn: AsyncConnection, tenant_id: uuid.UUID) -> Any:
        """The tenant's live runs (``_lock_live_runs``) and the tenant's row (FOR
        UPDATE) locked; the row read (None: there is no such tenant).

        Paths that add runs take the tenant first and a run after (retrying a node: the
        tenant, the node, its workflow run), while firing takes its runs first and the
        tenant after (a new run's key to it): no order fits both. So one of the two is
        waited for with nothing held, the other asked for without waiting; when that
        fails, what was taken is given back (rolled back to a savepoint) and the two are
        taken again the other way round, a moment later."""
        the_tenant = sa.select(tenants.c.name).where(tenants.c.id == tenant_id)
        if self.driver.dialect == "sqlite":  # one writer: nothing comes between
            await self._lock_live_runs(conn, tenant_id, sa.true())
            return (await conn.execute(the_tenant)).first()
        savepoint = Retake(conn, self.driver, "cw_tenant")
        await savepoint.set()
        for attempt in range(_TENANT_TRIES):
            try:
                if attempt % 2 == 0:
                    await self._lock_live_runs(conn, tenant_id, sa.true())
                    row = (await conn.execute(the_tenant.with_for_update(nowait=True))).first()
                else:
                    row = (await conn.execute(the_tenant.with_for_update())).first()
                    await self._lock_live_runs(conn, tenant_id, sa.true(), nowait=True)
            except DBAPIError as exc:
                await savepoint.give_back(exc, then_wait=min(0.005 * 2**attempt, 0.25))
                continue
            await savepoint.release()
            return row
        raise StoreUnavailableError(
            f"tenant {tenant_id} is too busy to be deleted now (its runs and its row are "
            "held by other changes); try again"
        )

    async def _job_locked(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> Any:
        row = (
            await conn.execute(
                sa.select(jobs.c.name, jobs.c.state, jobs.c.workflow.is_not(None).label("is_dag"))
                .where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
                .with_for_update()
            )
        ).first()
        if row is None:
            raise self._not_found("job", job_id)
        return row

    async def _in_progress(
        self, conn: AsyncConnection, where: sa.ColumnElement[bool]
    ) -> list[tuple[uuid.UUID, str]]:
        rows = await conn.execute(
            sa.select(runs.c.id, runs.c.state)
            .where(where, runs.c.state.in_(IN_PROGRESS))
            .order_by(runs.c.id)
        )
        return [(r.id, r.state) for r in rows]

    async def _bury_attempts(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        where: sa.ColumnElement[bool],
        at: datetime,
    ) -> None:
        """Tombstones for the live attempts and reservations of the selected runs (and
        out with the tombstones that have served their time)."""
        selected = _ids(where)
        live = {
            r.id
            for r in await conn.execute(
                sa.select(attempts.c.id).where(
                    attempts.c.tenant_id == tenant_id,
                    attempts.c.run_id.in_(selected),
                    attempts.c.state == AttemptState.RUNNING.value,
                )
            )
        }
        live |= {
            r.reserved_attempt
            for r in await conn.execute(
                sa.select(runs.c.reserved_attempt).where(
                    where,
                    # Reserved ahead of an instant, or of a gate (a workflow's node).
                    runs.c.state.in_([RunState.DISPATCHED.value, RunState.PENDING.value]),
                    runs.c.reserved_attempt.is_not(None),
                )
            )
        }
        await conn.execute(
            attempt_tombstones.delete().where(attempt_tombstones.c.deleted_at < at - TOMBSTONE_TTL)
        )
        if live:
            await conn.execute(
                attempt_tombstones.insert(),
                [{"id": i, "tenant_id": tenant_id, "deleted_at": at} for i in sorted(live)],
            )

    async def _delete_runs(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        where: sa.ColumnElement[bool],
        *,
        whole: bool = False,
    ) -> tuple[list[uuid.UUID], int]:
        """Delete the runs ``where`` selects with their attempts and their events:
        ``(ids of the runs that had attempts, how many runs)``.

        A job's runs are read first and their attempts and events deleted by those ids,
        a chunk at a time: a plan that follows the ids through the run indexes, which
        the planner cannot trade for a walk of every event of the tenant. A ``whole``
        tenant's go by the tenant alone, and who had attempts is not asked."""
        if whole:
            await conn.execute(
                events.delete().where(events.c.tenant_id == tenant_id, events.c.run_id.is_not(None))
            )
            await conn.execute(attempts.delete().where(attempts.c.tenant_id == tenant_id))
            result = await conn.execute(runs.delete().where(where))
            return [], result.rowcount
        ids = list((await conn.execute(sa.select(runs.c.id).where(where))).scalars())
        had: list[uuid.UUID] = []
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            of_attempts = sa.and_(
                attempts.c.tenant_id == tenant_id, self.driver.id_in(attempts.c.run_id, chunk)
            )
            had.extend(
                (
                    await conn.execute(sa.select(attempts.c.run_id).where(of_attempts).distinct())
                ).scalars()
            )
            await conn.execute(
                events.delete().where(
                    events.c.tenant_id == tenant_id, self.driver.id_in(events.c.run_id, chunk)
                )
            )
            await conn.execute(attempts.delete().where(of_attempts))
        result = await conn.execute(runs.delete().where(where))
        return sorted(had), result.rowcount
