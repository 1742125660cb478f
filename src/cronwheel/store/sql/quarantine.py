"""Quarantine: taking a poison row out of a scheduler pass.

A step of a pass (fire, expire, retry) works on a batch of rows in one transaction. A
row that makes the step fail — a schedule that no longer parses, a retry policy that
is not one, a value the database refuses — would fail the whole batch, at every pass,
for every tenant. Instead the row alone is quarantined::

    SCHEDULED / DISPATCHED / RUNNING ──quarantine──▶ DEAD_LETTER
                                                     quarantined_at = now
                                                     reason, last_error = the error

Its live attempt (if any) ends FAILED with the error, its one-off job finishes, and
the transition is recorded with ``data.quarantined`` and the step. It shows in
``GET /v1/alerts`` and the ``cronwheel_runs_quarantined`` gauge until it is
redriven (which clears the mark) or its job is cancelled.

Two layers find the row. Inside a step, a per-row computation that raises (planning a
firing, computing a backoff) quarantines that row in the same transaction
(:meth:`QuarantineMixin._quarantine`). A failure the step cannot attribute — the
database refusing a statement — fails the call; the scheduler node then splits the
batch until the failing row stands alone and quarantines it with
:meth:`runs_quarantine` (see ``scheduler/isolation.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import QuarantinedRun
from cronwheel.domain.states import QUARANTINE, AttemptState, JobState, RunState
from cronwheel.store.rows import event_row
from cronwheel.store.schema import NO_RESERVATION, attempts, jobs, runs
from cronwheel.store.sql import dag
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.observed import count_fates
from cronwheel.store.sql.statements import jobs_finish_one_off, may, update_each

__all__ = ["Poison", "QuarantineMixin"]

_ERROR_MAX = 2000


@dataclass(frozen=True, slots=True)
class Poison:
    """Why one run is quarantined: the step that failed on it, and the error."""

    step: str  # "fire" | "expire" | "retry" | "route"
    error: str


class QuarantineMixin(SqlCore):
    async def runs_quarantine(
        self,
        *,
        run_ids: Sequence[uuid.UUID],
        step: str,
        error: str,
        actor: str | None = None,
        now: datetime | None = None,
    ) -> list[uuid.UUID]:
        if not run_ids:
            return []
        async with self._write() as conn:
            at = await self._now(conn, now)
            return await self._quarantine(
                conn, {i: Poison(step, error) for i in run_ids}, at=at, actor=actor
            )

    async def runs_quarantined(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[QuarantinedRun]:
        stmt = (
            sa.select(
                runs.c.id,
                runs.c.tenant_id,
                runs.c.job_id,
                runs.c.job_name,
                runs.c.pool,
                runs.c.quarantined_at,
                runs.c.reason,
            )
            .join(jobs, jobs.c.id == runs.c.job_id)
            .where(
                runs.c.quarantined_at.is_not(None),
                runs.c.state == RunState.DEAD_LETTER.value,
                # Cancelling the job is the operator's answer to its poison runs.
                jobs.c.state != JobState.CANCELLED.value,
            )
            .order_by(runs.c.quarantined_at, runs.c.id)
            .limit(limit)
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            QuarantinedRun(
                run_id=r.id,
                tenant_id=r.tenant_id,
                job_id=r.job_id,
                job_name=r.job_name,
                pool=r.pool,
                quarantined_at=r.quarantined_at,
                reason=r.reason or "",
            )
            for r in rows
        ]

    async def runs_count_quarantined(self) -> int:
        async with self._read() as conn:
            count = (
                await conn.execute(
                    sa.select(sa.func.count())
                    .select_from(runs.join(jobs, jobs.c.id == runs.c.job_id))
                    .where(
                        runs.c.quarantined_at.is_not(None),
                        runs.c.state == RunState.DEAD_LETTER.value,
                        jobs.c.state != JobState.CANCELLED.value,
                    )
                )
            ).scalar_one()
        return int(count)

    async def _quarantine(
        self,
        conn: AsyncConnection,
        poison: Mapping[uuid.UUID, Poison],
        *,
        at: datetime,
        actor: str | None,
    ) -> list[uuid.UUID]:
        """Quarantine the live runs of ``poison`` inside the caller's transaction;
        returns those quarantined (a run already finished is left as it is)."""
        if not poison:
            return []
        live = (
            await conn.execute(
                sa.select(
                    runs.c.id, runs.c.tenant_id, runs.c.job_id, runs.c.state, runs.c.workflow_run_id
                )
                .where(self.driver.id_in(runs.c.id, sorted(poison)), may(QUARANTINE))
                .order_by(runs.c.id)
                .with_for_update()
            )
        ).all()
        if not live:
            return []
        reasons = {r.id: _reason(poison[r.id]) for r in live}
        await update_each(
            conn,
            runs,
            [
                {
                    "id": r.id,
                    "state": RunState.DEAD_LETTER.value,
                    "finished_at": at,
                    "quarantined_at": at,
                    "reason": reasons[r.id],
                    "last_error": poison[r.id].error,
                    "wait_reason": None,
                    **NO_RESERVATION,
                }
                for r in live
            ],
        )
        ids = [r.id for r in live]
        ended = (
            await conn.execute(
                attempts.update()
                .where(
                    self.driver.id_in(attempts.c.run_id, ids),
                    attempts.c.state == AttemptState.RUNNING.value,
                )
                .values(state=AttemptState.FAILED.value, finished_at=at)
                .returning(attempts.c.id, attempts.c.run_id)
            )
        ).all()
        await update_each(
            conn,
            attempts,
            [{"id": a.id, "error": poison[a.run_id].error} for a in ended],
        )
        attempt_of = {a.run_id: a.id for a in ended}
        await self._insert_events(
            conn,
            [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    attempt_id=attempt_of.get(r.id),
                    from_state=r.state,
                    to_state=RunState.DEAD_LETTER.value,
                    actor=actor,
                    reason=reasons[r.id],
                    data={
                        "quarantined": True,
                        "step": poison[r.id].step,
                        "error": poison[r.id].error,
                    },
                )
                for r in live
            ],
        )
        await jobs_finish_one_off(conn, self.driver, [r.job_id for r in live], at)
        await count_fates(conn, [(r.tenant_id, RunState.DEAD_LETTER) for r in live])
        workflows = {r.workflow_run_id for r in live if r.workflow_run_id is not None}
        await dag.advance(self, conn, workflows, at=at, actor=actor)
        return ids


_STEPS = {
    "fire": "firing it",
    "expire": "ending its expired attempt",
    "retry": "scheduling its retry",
    "route": "checking which workers can take it",
}


def _reason(poison: Poison) -> str:
    doing = _STEPS.get(poison.step, poison.step)
    return (
        f"quarantined: the scheduler failed {doing} ({poison.error}); the run was "
        "taken out so that nothing else waits on it. Fix the job, then redrive the run"
    )[:_ERROR_MAX]
