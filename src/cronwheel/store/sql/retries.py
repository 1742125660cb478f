"""What happens to a run when its attempt ends without success: a worker's failure,
or the expiry sweep finding its lease lost or its deadline passed. The run is retried
after its backoff, dead-lettered when its tries are spent, failed when the error is not
retryable, or cancelled when a cancel was asked for; a paused job's retry is parked
until it resumes. A run whose own retry policy cannot give a delay is quarantined
(``quarantine.py``) rather than failing the batch it came in.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import describe_error
from cronwheel.domain.retry import backoff_delay
from cronwheel.domain.states import FAIL, AttemptState, JobState, RunState
from cronwheel.store.notices import ANNOUNCE_HORIZON, CHANNEL_RUNS_NEW, announce
from cronwheel.store.rows import event_row
from cronwheel.store.schema import PARKED_FIRE_AT, jobs, runs
from cronwheel.store.sql import dag
from cronwheel.store.sql.observed import count_fates
from cronwheel.store.sql.quarantine import Poison, QuarantineMixin
from cronwheel.store.sql.statements import jobs_finish_one_off, may, update_each

__all__ = ["Ended", "RetriesMixin"]


@dataclass(frozen=True, slots=True)
class Ended:
    """An attempt that ended without success, and what its run should do next."""

    attempt_id: uuid.UUID
    run_id: uuid.UUID
    state: AttemptState
    error: str
    retryable: bool
    retry_after: float | None = None  # the worker's floor under the backoff, in seconds


class RetriesMixin(QuarantineMixin):
    _rng = random.Random()

    async def _after_failures(
        self, conn: AsyncConnection, failures: Sequence[Ended], at: datetime, *, actor: str
    ) -> dict[uuid.UUID, RunState]:
        """Retry, dead-letter or fail the runs of attempts that ended without success.
        Returns each run's new state."""
        if not failures:
            return {}
        by_run = {f.run_id: f for f in failures}
        rows = (
            await conn.execute(
                sa.select(
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.attempt,
                    runs.c.max_attempts,
                    runs.c.retry,
                    runs.c.cancel_requested,
                    runs.c.shard,
                    runs.c.workflow_run_id,
                )
                .where(
                    self.driver.id_in(runs.c.id, list(by_run)),
                    may(FAIL),
                )
                .order_by(runs.c.id)
                .with_for_update()  # a cancel must not slip between this read and the write
            )
        ).all()
        paused = (
            {
                j.id
                for j in await conn.execute(
                    sa.select(jobs.c.id).where(
                        self.driver.id_in(jobs.c.id, list({r.job_id for r in rows})),
                        jobs.c.state == JobState.PAUSED.value,
                    )
                )
            }
            if rows
            else set()
        )
        updates: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        notices: list[str] = []
        finished_jobs: list[uuid.UUID] = []
        poison: dict[uuid.UUID, Poison] = {}
        for r in rows:
            f = by_run[r.id]
            fire_at = None
            if r.cancel_requested:
                target, reason = RunState.CANCELLED, "cancelled while running"
            elif not f.retryable:
                target, reason = RunState.FAILED, f"failed without retry: {f.error}"
            elif r.attempt >= r.max_attempts:
                target = RunState.DEAD_LETTER
                reason = f"gave up after {r.attempt} attempts: {f.error}"
            else:
                target = RunState.SCHEDULED
                try:
                    delay = backoff_delay(r.retry, r.attempt, self._rng)
                    waited = ""
                    if f.retry_after is not None and f.retry_after > delay:
                        delay, waited = f.retry_after, " (as the worker asked: retry_after)"
                    fire_at = at + timedelta(seconds=delay)
                except Exception as exc:  # this run's own policy: it alone is poison
                    poison[r.id] = Poison("retry", describe_error(exc))
                    continue
                reason = (
                    f"retry {r.attempt + 1} of {r.max_attempts} in {delay:.2f} s{waited}: {f.error}"
                )
                if r.job_id in paused:  # parked until the job resumes
                    fire_at, reason = PARKED_FIRE_AT, f"job paused; {reason}"
            row: dict[str, Any] = {
                "id": r.id,
                "state": target.value,
                "reason": reason[:2000],
                "last_error": f.error,
                "finished_at": None,
                "fire_at": fire_at,
            }
            if target is RunState.SCHEDULED:
                assert fire_at is not None
                if fire_at < at + ANNOUNCE_HORIZON:
                    notices.append(announce(r.id, r.shard, fire_at))
            else:
                row["finished_at"] = at
                finished_jobs.append(r.job_id)
            updates.append(row)
            event_rows.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    attempt_id=f.attempt_id,
                    from_state=FAIL.source.value,
                    to_state=target.value,
                    actor=actor,
                    reason=reason[:2000],
                    data={"attempt": r.attempt, "attempt_state": f.state.value},
                )
            )
        # fire_at only changes for retries; keep the others' value.
        for row in updates:
            if row["fire_at"] is None:
                del row["fire_at"]
        for keys in {tuple(sorted(u)) for u in updates}:
            await update_each(conn, runs, [u for u in updates if tuple(sorted(u)) == keys])
        await self._insert_events(conn, event_rows)
        await jobs_finish_one_off(conn, self.driver, finished_jobs, at)
        if notices:
            await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        states = {u["id"]: RunState(u["state"]) for u in updates}
        tenant_of = {r.id: r.tenant_id for r in rows}
        await count_fates(conn, [(tenant_of[i], s) for i, s in states.items()])
        for run_id in await self._quarantine(conn, poison, at=at, actor=actor):
            states[run_id] = RunState.DEAD_LETTER
        workflows = {
            r.workflow_run_id
            for r in rows
            if r.workflow_run_id is not None and states.get(r.id) not in (None, RunState.SCHEDULED)
        }
        # A node run that ended moves its DAG on in this transaction.
        await dag.advance(self, conn, workflows, at=at, actor=actor)
        return states
