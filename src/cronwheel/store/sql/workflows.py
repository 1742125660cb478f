"""Workflows in the store: creating one (a job whose ``workflow`` holds its DAG, and
its first workflow run), and reading workflow runs with their nodes. Everything else a
workflow does is a job's or a run's: pausing, resuming, cancelling and triggering it
are its job's operations; cancelling a workflow run cancels its nodes (``_cancel_runs``)
and retrying a node is a run's retry, which reopens the workflow run (``dag.reopen``).
The DAG itself is advanced by ``dag.py``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from cronwheel.domain.model import Job, NewJob, Page, Run
from cronwheel.store.notices import CHANNEL_RUNS_NEW
from cronwheel.store.rows import history_cursor, history_position, run_from
from cronwheel.store.schema import jobs, runs
from cronwheel.store.sql.jobs import JobsMixin

__all__ = ["WorkflowsMixin"]


class WorkflowsMixin(JobsMixin):
    async def workflows_create(
        self, tenant_id: uuid.UUID, *, new: NewJob, now: datetime | None = None
    ) -> tuple[Job, Run | None, bool]:
        async with self._write() as conn:
            made, out = await self._jobs_create_in(conn, tenant_id, [new], now)
            [m] = out
            if m.created:  # a key's replay is the workflow created then, as it is
                await conn.execute(
                    jobs.update()
                    .where(jobs.c.tenant_id == tenant_id, jobs.c.id == m.job.id)
                    .values(workflow=new.workflow)
                )
        if made.notices:
            self.driver.notify_committed(CHANNEL_RUNS_NEW, made.notices, self._deliver, within=0.0)
        return m.job, m.run_record(), m.created

    async def workflow_runs_list(
        self,
        tenant_id: uuid.UUID,
        workflow_id: uuid.UUID,
        *,
        states: Sequence[str] = (),
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page[Run]:
        # The job's runs by the unique key (tenant_id, job_id, due_at, node): its
        # workflow runs are those of node ''.
        stmt = sa.select(*runs.c).where(
            runs.c.tenant_id == tenant_id,
            runs.c.job_id == workflow_id,
            runs.c.node == "",
        )
        if states:
            stmt = stmt.where(runs.c.state.in_(list(states)))
        position = history_position(cursor)
        if position is not None:  # a workflow's runs never share a due instant
            stmt = stmt.where(runs.c.due_at < position[0])
        stmt = stmt.order_by(runs.c.due_at.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [run_from(r) for r in rows[:limit]]
        last = items[-1] if len(rows) > limit else None
        return Page(items, None if last is None else history_cursor(last.due_at, last.id))

    async def workflow_run_nodes(
        self, tenant_id: uuid.UUID, run_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[Run]]:
        out: dict[uuid.UUID, list[Run]] = {i: [] for i in run_ids}
        if not run_ids:
            return out
        async with self._read() as conn:
            rows = await conn.execute(
                sa.select(*runs.c).where(
                    self.driver.id_in(runs.c.workflow_run_id, list(run_ids)),
                    runs.c.tenant_id == tenant_id,
                )
            )
            for r in rows:
                out[r.workflow_run_id].append(run_from(r))
        return out
