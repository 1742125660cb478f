"""Runs, one due occurrence each: reading and listing them, cancelling one, counting
them by state, and the scheduler's scan of its shards' due window."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.audit import Actor, name_of
from cronwheel.domain.errors import IllegalTransitionError
from cronwheel.domain.model import DueRun, Page, Run
from cronwheel.domain.states import ACTIVE_STATES, RunState
from cronwheel.store.driver import Driver
from cronwheel.store.rows import history_cursor, history_position, run_from
from cronwheel.store.schema import jobs, runs, tenants
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import RunFilter

__all__ = ["RunsMixin", "history_select", "history_statement"]


class RunsMixin(SqlCore):
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
        tenant_id: uuid.UUID | None,
        *,
        filter: RunFilter | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Run]:
        f = filter or RunFilter()
        stmt = history_statement(self.driver, tenant_id, f, history_position(cursor), limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [run_from(r) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(items, history_cursor(items[-1].due_at, items[-1].id) if more else None)

    async def runs_last_finished(
        self, tenant_id: uuid.UUID, *, job_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Run]:
        if not job_ids:
            return {}
        own = runs.alias("own")
        # Per job, a correlated walk of its key (tenant_id, job_id, due_at, node) from
        # the newest end, stopping at the first finished run: it reads the job's
        # unfinished runs ahead of it (a recurring job keeps one), never its history.
        # Both databases run the correlated LIMIT 1, where SQLite has no LATERAL.
        newest = (
            sa.select(own.c.id)
            .where(
                own.c.tenant_id == tenant_id,
                own.c.job_id == jobs.c.id,
                own.c.finished_at.is_not(None),
            )
            .order_by(own.c.due_at.desc(), own.c.node.desc())
            .limit(1)
            .correlate(jobs)
            .scalar_subquery()
        )
        chosen = sa.select(newest).where(
            jobs.c.tenant_id == tenant_id, self.driver.id_in(jobs.c.id, list(job_ids))
        )
        stmt = sa.select(*runs.c).where(runs.c.tenant_id == tenant_id, runs.c.id.in_(chosen))
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return {r.job_id: run_from(r) for r in rows}

    async def runs_cancel(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        actor: Actor | None = None,
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
                actor=name_of(actor),
                reason=reason or "cancelled by request",
            )
            await self._insert_events(conn, rows)
            row = (await conn.execute(sa.select(*runs.c).where(runs.c.id == run_id))).one()
            # A running run is asked to stop: it stays RUNNING until its handler ends.
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="run.cancel",
                target_kind="run",
                target_id=run_id,
                reason=reason,
                before={"state": current.state},
                after={"state": row.state, "cancel_requested": row.cancel_requested},
            )
        return run_from(row)

    async def runs_count_by_state(self) -> dict[str, int]:
        async with self._read() as conn:
            rows = (
                await conn.execute(sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state))
            ).all()
        counts = {s.value: 0 for s in RunState}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    async def runs_due_scan(
        self,
        *,
        shards: Sequence[int],
        until: datetime,
        limit: int = 10_000,
        since: datetime | None = None,
        after_id: uuid.UUID | None = None,
    ) -> list[DueRun]:
        if not shards:
            return []
        stmt = (
            sa.select(runs.c.id, runs.c.shard, runs.c.fire_at)
            .where(
                runs.c.state == RunState.SCHEDULED.value,
                self.driver.id_in(runs.c.shard, list(shards)),
                runs.c.fire_at < until,
            )
            .order_by(runs.c.fire_at, runs.c.id)
            .limit(limit)
        )
        if since is not None and after_id is not None:
            stmt = stmt.where(
                sa.or_(
                    runs.c.fire_at > since,
                    sa.and_(runs.c.fire_at == since, runs.c.id > after_id),
                )
            )
        elif since is not None:
            stmt = stmt.where(runs.c.fire_at >= since)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [DueRun(id=r.id, shard=r.shard, fire_at=r.fire_at) for r in rows]


def history_statement(
    driver: Driver,
    tenant_id: uuid.UUID | None,
    f: RunFilter,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> sa.Select[Any]:
    """The first ``limit`` runs of the tenant (None: of every tenant) that ``f``
    selects after the position ``after``, newest first."""
    if tenant_id is not None:
        return history_select(driver, runs.c.tenant_id == tenant_id, f, after, limit)
    if f.job_id is not None:
        # A job names its tenant.
        owner = sa.select(jobs.c.tenant_id).where(jobs.c.id == f.job_id).scalar_subquery()
        return history_select(driver, runs.c.tenant_id == owner, f, after, limit)
    if driver.dialect != "postgresql":
        # On SQLite every tenant's runs are one walk.
        return history_select(driver, sa.true(), f, after, limit)
    # Each tenant's own index walk (a LATERAL join over the tenants), merged: no page
    # reads more than ``limit`` rows of any tenant.
    every = sa.select(tenants.c.id.label("tenant_id")).subquery("every")
    one = history_select(
        driver, runs.c.tenant_id == every.c.tenant_id, f, after, limit, outer=every
    )
    walk = one.lateral("one")
    return (
        sa.select(*walk.c)
        .select_from(every.join(walk, sa.true()))
        .order_by(walk.c.due_at.desc(), walk.c.id.desc())
        .limit(limit)
    )


def history_select(
    driver: Driver,
    tenant: sa.ColumnElement[bool],
    f: RunFilter,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
    *,
    outer: sa.FromClause | None = None,
) -> sa.Select[Any]:
    """The first ``limit`` runs matching ``tenant`` and ``f`` after the position
    ``after``, in the history's order (due_at, then id, descending). Each is one
    index range walked backwards, stopping at ``limit`` (docs/history.md): by job
    the key (tenant, job, due_at), by state ``ix_runs_tenant_state``, else
    ``ix_runs_tenant_due``; several states are one walk each, merged."""
    where: list[sa.ColumnElement[bool]] = [tenant]
    if f.job_id is not None:
        where.append(runs.c.job_id == f.job_id)
    if f.since is not None:
        where.append(runs.c.due_at >= f.since)
    if f.until is not None:
        where.append(runs.c.due_at < f.until)
    where += [driver.json_has(runs.c.tags, tag) for tag in f.tags]
    if f.pool is not None:
        where.append(runs.c.pool == f.pool)
    # A job's runs share a due instant only in a workflow (its workflow run and node
    # runs), and never a due instant and node (the key (tenant_id, job_id, due_at,
    # node)): by job, ties are broken by node, in the key's order, with no sort.
    tie = runs.c.node if f.job_id is not None else runs.c.id
    if after is not None:
        due_at, run_id = after
        # The bound on due_at alone is what the index walk starts from; the id (by
        # job: the node of the run the cursor names) breaks ties among runs due at the
        # same instant.
        bound: Any = run_id
        if f.job_id is not None:
            bound = sa.select(runs.c.node).where(runs.c.id == run_id).scalar_subquery()
        where += [
            runs.c.due_at <= due_at,
            sa.or_(runs.c.due_at < due_at, tie < bound),
        ]
    order = (runs.c.due_at.desc(), tie.desc())

    def walk(*more: sa.ColumnElement[bool]) -> sa.Select[Any]:
        stmt = sa.select(*runs.c).where(*where, *more).order_by(*order).limit(limit)
        # Inside a LATERAL join: ``tenant`` names the outer row's tenant.
        return stmt if outer is None else stmt.correlate(outer)

    states = sorted(set(f.states or ()))
    if len(states) <= 1:
        return walk(*(runs.c.state == state for state in states))
    walks = [walk(runs.c.state == state).subquery(f"s{i}") for i, state in enumerate(states)]
    merged = sa.union_all(*(sa.select(*w.c) for w in walks)).subquery("merged")
    ties = merged.c.node if f.job_id is not None else merged.c.id
    return sa.select(*merged.c).order_by(merged.c.due_at.desc(), ties.desc()).limit(limit)
