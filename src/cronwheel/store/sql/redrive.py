"""Sending finished runs back: a redrive (one dead letter, or a batch of them) and a
retry (a failed or cancelled run too)::

    DEAD_LETTER ──redrive / retry──┐
    FAILED ────────retry───────────┼──▶ SCHEDULED  fire_at = now,
    CANCELLED ─────retry───────────┘              max_attempts = attempt + the policy's

A run sent back starts a new series of attempts: its attempt count goes on, and it may
make its retry policy's ``max_attempts`` more. A finished one-off job is active again
while the run is live (the attempts path finishes it when the run ends).

The run's job decides what "again" means: a *cancelled* job runs nothing more, so its
runs are not sent back (one named alone: 409; in a batch: skipped, "its job is
cancelled"); a *paused* job's run is sent back parked, as the pause parked its other
runs, and goes when the job resumes. The jobs are read locked (FOR SHARE) after their
runs, so a pause or cancel committing meanwhile waits, and then sees the run.

One path writes, whatever chose the runs: ``_runs_send_back`` takes runs the caller
has locked and moves them all with one UPDATE, reopens their one-off jobs with one
UPDATE and records them with one insert. Runs are locked before their jobs, the order
of every path that changes both.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.model import Run
from cronwheel.domain.states import REDRIVE, JobState, Move, RunState
from cronwheel.domain.workflow import WORKFLOW_POOL
from cronwheel.store.notices import CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import event_row, run_from
from cronwheel.store.schema import PARKED_FIRE_AT, jobs, runs
from cronwheel.store.sql import dag
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.pending import PendingLimit, pending_admit, tenant_for_new_runs
from cronwheel.store.sql.statements import ONE_OFF_KINDS, PAUSED_REASON, may
from cronwheel.store.values import REDRIVE_BATCH_MAX, RedriveBatch

__all__ = ["OF_CANCELLED_JOB", "RedriveMixin"]

_DEFAULT_REASON = "sent back by request"

# The runs whose job is cancelled: never sent back.
OF_CANCELLED_JOB = (
    sa.select(jobs.c.id)
    .where(
        jobs.c.tenant_id == runs.c.tenant_id,
        jobs.c.id == runs.c.job_id,
        jobs.c.state == JobState.CANCELLED.value,
    )
    .exists()
)


class RedriveMixin(SqlCore):
    async def runs_redrive(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        move: Move = REDRIVE,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Run:
        async with self._write() as conn:
            at = await self._now(conn, now)
            max_pending = await tenant_for_new_runs(conn, tenant_id)
            await self._lock_workflow_runs_of(
                conn, tenant_id, sa.select(runs.c.id).where(runs.c.id == run_id)
            )
            current = (
                await conn.execute(
                    sa.select(
                        runs.c.id,
                        runs.c.state,
                        runs.c.pool,
                        runs.c.workflow_run_id,
                        runs.c.node,
                        runs.c.job_id,
                    )
                    .where(runs.c.tenant_id == tenant_id, runs.c.id == run_id)
                    .with_for_update()
                )
            ).first()
            if current is None:
                raise self._not_found("run", run_id)
            if current.pool == WORKFLOW_POOL and current.workflow_run_id is None:
                raise IllegalTransitionError(
                    f"run {run_id} is a workflow run: retry its failed nodes instead "
                    f"(POST /v1/workflow-runs/{run_id}/nodes/{{node}}/retry)",
                    source=current.state,
                    target=RunState.SCHEDULED.value,
                )
            if current.state not in move.source_values:
                raise IllegalTransitionError(
                    f"run {run_id} is {current.state}; only a run that is "
                    f"{' or '.join(move.source_values)} can be sent back",
                    source=current.state,
                    target=RunState.SCHEDULED.value,
                )
            await dag.refuse_unrunnable(self, conn, current)
            job_state = (await self._job_states(conn, tenant_id, [run_id]))[run_id]
            if job_state == JobState.CANCELLED.value:
                raise IllegalTransitionError(
                    f"run {run_id} cannot be sent back: its job is cancelled and runs "
                    "nothing more (trigger or create a job to run it again)",
                    source=current.state,
                    target=RunState.SCHEDULED.value,
                )
            await pending_admit(conn, tenant_id, limit=max_pending, adding=1)
            [run] = await self._runs_send_back(
                conn,
                tenant_id,
                {current.id: current.state},
                at=at,
                actor=name_of(actor),
                reason=reason or _DEFAULT_REASON,
                parked={run_id} if job_state == JobState.PAUSED.value else set(),
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action=f"run.{move.name}",
                target_kind="run",
                target_id=run_id,
                reason=reason,
                before={"state": current.state},
                after={"state": run.state.value, "held": run.fire_at >= PARKED_FIRE_AT},
            )
        return run

    async def runs_redrive_many(
        self,
        tenant_id: uuid.UUID,
        *,
        run_ids: Sequence[uuid.UUID] | None = None,
        job_id: uuid.UUID | None = None,
        limit: int = REDRIVE_BATCH_MAX,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> RedriveBatch:
        if not 1 <= limit <= REDRIVE_BATCH_MAX:
            raise ValidationError(
                f"limit: must be from 1 to {REDRIVE_BATCH_MAX}, not {limit}", field="limit"
            )
        named = None if run_ids is None else list(dict.fromkeys(run_ids))
        if named is not None and len(named) > REDRIVE_BATCH_MAX:
            raise ValidationError(
                f"run_ids: at most {REDRIVE_BATCH_MAX} ids at once, not {len(named)}",
                field="run_ids",
            )
        # A cancelled job's dead letters are not sent back: not even counted as left.
        selected = [runs.c.tenant_id == tenant_id, may(REDRIVE), ~OF_CANCELLED_JOB]
        if job_id is not None:
            selected.append(runs.c.job_id == job_id)
        if named is not None:
            selected.append(self.driver.id_in(runs.c.id, named))
        async with self._write() as conn:
            at = await self._now(conn, now)
            max_pending = await tenant_for_new_runs(conn, tenant_id)
            # In id order, the order every path locks runs in.
            chosen = sa.select(runs.c.id).where(*selected).order_by(runs.c.id).limit(limit)
            locked = []
            if named != []:
                await self._lock_workflow_runs_of(conn, tenant_id, chosen)
                lock = chosen.add_columns(runs.c.state).with_for_update()
                locked = list(await conn.execute(lock))
            if not locked and job_id is not None:
                await self._job_must_exist(conn, tenant_id, job_id)
            sent = await self._redrive_locked(
                conn,
                tenant_id,
                {r.id: r.state for r in locked},
                at=at,
                by=name_of(actor),
                reason=reason or _DEFAULT_REASON,
                max_pending=max_pending,
            )
            if sent:
                await self._audit(
                    conn,
                    actor,
                    at=at,
                    tenant_id=tenant_id,
                    action="run.redrive",
                    # A job's dead letters, or the runs named.
                    target_kind="run" if job_id is None else "job",
                    target_id=job_id,
                    reason=reason,
                    before={"state": RunState.DEAD_LETTER.value},
                    after={"state": RunState.SCHEDULED.value, "runs": [r.id for r in sent]},
                )
            # Those sent back are SCHEDULED now: any match left is a dead letter the
            # limit cut off.
            more = len(locked) == limit and (
                (await conn.execute(sa.select(runs.c.id).where(*selected).limit(1))).first()
                is not None
            )
            skipped: dict[uuid.UUID, str] = {}
            if named:
                sent_ids = {r.id for r in sent}
                skipped = await self._not_sent(
                    conn, tenant_id, [i for i in named if i not in sent_ids]
                )
        return RedriveBatch(runs=sent, skipped=skipped, more=more)

    async def _redrive_locked(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        locked: Mapping[uuid.UUID, str],
        *,
        at: datetime,
        by: str | None,
        reason: str,
        max_pending: PendingLimit | None,
    ) -> list[Run]:
        """Send back the dead letters of ``locked`` (id → state, locked by the caller)
        as their jobs allow (see the module's docstring), once the tenant's pending
        limit admits them."""
        job_states = await self._job_states(conn, tenant_id, list(locked))
        # (A job cancelled between the selection and its lock: its runs stay.)
        going = {
            run_id: state
            for run_id, state in locked.items()
            if job_states.get(run_id) != JobState.CANCELLED.value
        }
        await pending_admit(conn, tenant_id, limit=max_pending, adding=len(going))
        return await self._runs_send_back(
            conn,
            tenant_id,
            going,
            at=at,
            actor=by,
            reason=reason,
            parked={i for i in going if job_states.get(i) == JobState.PAUSED.value},
        )

    async def _runs_send_back(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        sources: Mapping[uuid.UUID, str],
        *,
        at: datetime,
        actor: str | None,
        reason: str,
        parked: set[uuid.UUID],
    ) -> list[Run]:
        """Move the runs of ``sources`` (id → state, locked by the caller, checked to be
        sent back) to SCHEDULED due ``at`` — those of ``parked`` (their job is paused)
        parked until it resumes —, with a new series of attempts; reopen their finished
        one-off jobs; record them, and announce those that will fire. Returns them in id
        order."""
        if not sources:
            return []
        held = self.driver.id_in(runs.c.id, sorted(parked)) if parked else sa.false()
        # Each run's own policy, as copied from its job: no per-row round trip.
        series = sa.func.coalesce(runs.c.retry["max_attempts"].as_integer(), 1)
        rows = (
            await conn.execute(
                runs.update()
                .where(runs.c.tenant_id == tenant_id, self.driver.id_in(runs.c.id, list(sources)))
                .values(
                    state=RunState.SCHEDULED.value,
                    fire_at=sa.case((held, PARKED_FIRE_AT), else_=at),
                    finished_at=None,
                    cancel_requested=False,
                    reason=sa.case((held, PAUSED_REASON), else_=reason),
                    max_attempts=runs.c.attempt + series,
                    quarantined_at=None,
                )
                .returning(*runs.c)
            )
        ).all()
        sent = sorted((run_from(r) for r in rows), key=lambda r: r.id)
        # Like the attempts path that finishes one-off jobs: one UPDATE for the batch.
        await conn.execute(
            jobs.update()
            .where(
                jobs.c.tenant_id == tenant_id,
                self.driver.id_in(jobs.c.id, sorted({r.job_id for r in sent})),
                jobs.c.state == JobState.FINISHED.value,
                jobs.c.kind.in_(ONE_OFF_KINDS),
            )
            .values(state=JobState.ACTIVE.value, updated_at=at)
        )
        await self._insert_events(
            conn,
            [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=tenant_id,
                    job_id=run.job_id,
                    run_id=run.id,
                    from_state=sources[run.id],
                    to_state=RunState.SCHEDULED.value,
                    actor=actor,
                    reason=reason,
                )
                for run in sent
            ]
            + [
                event_row(
                    at=at,
                    kind="run.parked",
                    tenant_id=tenant_id,
                    job_id=run.job_id,
                    run_id=run.id,
                    from_state=RunState.SCHEDULED.value,
                    to_state=RunState.SCHEDULED.value,
                    actor=actor,
                    reason=PAUSED_REASON,
                )
                for run in sent
                if run.id in parked
            ],
        )
        going = [announce(r.id, r.shard, at) for r in sent if r.id not in parked]
        if going:
            await self._notify(conn, CHANNEL_RUNS_NEW, going)
        # A workflow's node sent back continues its workflow run from there.
        await dag.reopen(self, conn, [r.id for r in sent if r.workflow_run_id], at=at, actor=actor)
        return sent

    async def _lock_workflow_runs_of(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, chosen: sa.Select[Any]
    ) -> None:
        """Lock the workflow runs of the nodes among the runs ``chosen`` selects (by
        id), in id order, before the nodes themselves. A node that has ended is changed
        only with its workflow run held: retrying a node sends the nodes it had
        cancelled or skipped below it back to waiting (``dag.reopen``), holding the
        workflow run; a retry of one of those must take the workflow run first too, or
        each would hold what the other waits for. (A live node is taken before its
        workflow run, ``_lock_live_runs``: it is never one a retry takes.)"""
        owner, nodes = runs.alias("owner"), runs.alias("nodes")
        await conn.execute(
            sa.select(owner.c.id)
            .where(
                owner.c.tenant_id == tenant_id,
                owner.c.id.in_(
                    sa.select(nodes.c.workflow_run_id).where(
                        nodes.c.id.in_(chosen.scalar_subquery()),
                        nodes.c.workflow_run_id.is_not(None),
                    )
                ),
            )
            .order_by(owner.c.id)
            .with_for_update()
        )

    async def _job_states(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, run_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, str]:
        """The state of each run's job, the jobs locked (after their runs, in id order)
        until the transaction ends: a pause or cancel waits for it, and then sees the
        runs it sent back. FOR NO KEY UPDATE, not SHARE: two redrives that both reopen a
        finished job would each hold a share and wait for the other's to update it."""
        if not run_ids:
            return {}
        rows = await conn.execute(
            sa.select(runs.c.id, jobs.c.state)
            .join(jobs, sa.and_(jobs.c.tenant_id == runs.c.tenant_id, jobs.c.id == runs.c.job_id))
            .where(runs.c.tenant_id == tenant_id, self.driver.id_in(runs.c.id, run_ids))
            .order_by(jobs.c.id)
            .with_for_update(key_share=True, of=jobs)
        )
        return {r.id: r.state for r in rows}

    async def _not_sent(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, run_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, str]:
        """Why each of ``run_ids`` (named, not sent back) was not, in the order given."""
        if not run_ids:
            return {}
        rows = await conn.execute(
            sa.select(runs.c.id, runs.c.state, jobs.c.state.label("job_state"))
            .join(jobs, sa.and_(jobs.c.tenant_id == runs.c.tenant_id, jobs.c.id == runs.c.job_id))
            .where(runs.c.tenant_id == tenant_id, self.driver.id_in(runs.c.id, run_ids))
        )
        found = {r.id: r for r in rows}
        out: dict[uuid.UUID, str] = {}
        for run_id in run_ids:
            row = found.get(run_id)
            if row is None:
                out[run_id] = "not found"
            elif row.state != RunState.DEAD_LETTER.value:
                out[run_id] = f"not a dead letter: {row.state}"
            elif row.job_state == JobState.CANCELLED.value:
                out[run_id] = "its job is cancelled"
            else:
                out[run_id] = "over the limit"
        return out

    async def _job_must_exist(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> None:
        row = (
            await conn.execute(
                sa.select(jobs.c.id).where(jobs.c.tenant_id == tenant_id, jobs.c.id == job_id)
            )
        ).first()
        if row is None:
            raise self._not_found("job", job_id)
