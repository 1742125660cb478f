"""Routing: why a dispatched run waits when no live worker can take it.

::

    DISPATCHED, wait_reason NULL
        │ waited min_wait seconds and no live worker can take it (routing check);
        │ one "run.waiting" event per run, when its reason is first set
        ▼
    DISPATCHED, wait_reason "no live worker in pool 'gpu' has capabilities ['cuda']"
        │ a worker that can take it appears: the next check clears the reason
        │ a worker leases it: leasing clears the reason (DISPATCHED → RUNNING)
        ▼
    wait_reason NULL          (a run that leaves DISPATCHED otherwise — cancelled,
                               paused — loses its reason at the next check)

A worker is *live* when it has not deregistered and either was seen within
``worker_ttl`` seconds (every lease call, long-polls included, records it) or holds an
attempt whose lease has not expired (a busy worker heartbeats instead of leasing). It
*can take* a run when it serves the run's pool and tenant (a tenant's worker serves
only that tenant) and its capabilities include all the run requires. Whether any live
worker is free is not the question: a busy capable worker will take the run later.

The check works on groups, never on single runs: one query groups the DISPATCHED runs
of the caller's shards by (tenant, pool, requires), one reads the live workers of
those pools, and one UPDATE per group whose reason changes. Runs locked by someone
else (being leased, cancelled) are skipped, never waited for: the next check sees them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import RouteCheck, UnroutableRuns
from cronwheel.domain.spec import WEBHOOK_CAPABILITY
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store.rows import event_row
from cronwheel.store.schema import attempts, runs, workers
from cronwheel.store.sql.quarantine import Poison, QuarantineMixin

__all__ = ["RoutingMixin", "wait_reason"]

_DISPATCHED = RunState.DISPATCHED.value
# Runs in the ready queue (the ready-queue index's predicate): a reserved run is held by
# a live worker already, so it never waits for want of one.
_QUEUED = (runs.c.state == _DISPATCHED, runs.c.reserved_token.is_(None))


def _waited_since(cutoff: datetime) -> sa.ColumnElement[bool]:
    """Leasable since ``cutoff`` or longer: dispatched by then, and due by then (a run
    dispatched ahead of its instant is not waiting before it)."""
    return sa.and_(runs.c.dispatched_at <= cutoff, runs.c.fire_at <= cutoff)


@dataclass(frozen=True, slots=True)
class _LiveWorker:
    tenant_id: uuid.UUID | None
    pool: str
    capabilities: frozenset[str]
    webhooks_only: bool = False


def _unlocked(*where: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """The runs matching ``where`` that nobody else holds locked right now (a lease, a
    cancel, a result): the others wait for the next check, so the check never waits on
    a hot path, nor can it deadlock with one."""
    pick = sa.select(runs.c.id).where(*where).with_for_update(skip_locked=True)
    return runs.c.id.in_(pick.scalar_subquery())


def wait_reason(
    *, tenant_id: uuid.UUID, pool: str, requires: Sequence[str], live: Sequence[_LiveWorker]
) -> str | None:
    """Why runs of ``tenant_id`` in ``pool`` requiring ``requires`` wait, or None when a
    live worker can take them. Only workers serving the tenant are considered, so the
    reason tells nothing about other tenants' workers."""
    need = set(requires)
    # Webhook runs require the webhook capability; any other run has a task, which a
    # worker that only calls webhooks cannot run.
    task_runs = WEBHOOK_CAPABILITY not in need
    for w in live:
        if w.webhooks_only and task_runs:
            continue
        if w.pool == pool and w.tenant_id in (None, tenant_id) and need <= w.capabilities:
            return None
    if not need:
        return f"no live worker in pool {pool!r}"
    return f"no live worker in pool {pool!r} has capabilities {sorted(need)!r}"


class RoutingMixin(QuarantineMixin):
    async def runs_route_check(
        self,
        *,
        shards: Sequence[int],
        min_wait: float = 5.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> RouteCheck:
        if not shards:
            return RouteCheck(waiting=0, marked=0, cleared=0)
        async with self._write() as conn:
            at = await self._now(conn, now)
            in_shards = self.driver.id_in(runs.c.shard, list(shards))
            cleared = await self._clear_stale(conn, in_shards)
            cutoff = at - timedelta(seconds=min_wait)
            groups, poison = await self._waiting_groups(conn, in_shards, cutoff)
            if poison:
                await self._quarantine_groups(conn, in_shards, poison, at)
            if not groups:
                return RouteCheck(waiting=0, marked=0, cleared=cleared)
            live = await self._live_workers(conn, {g.pool for g in groups}, at, worker_ttl)
            waiting = marked = 0
            events: list[dict[str, Any]] = []
            for g in groups:
                reason = wait_reason(
                    tenant_id=g.tenant_id, pool=g.pool, requires=g.requires, live=live
                )
                where = sa.and_(
                    *_QUEUED,
                    in_shards,
                    runs.c.tenant_id == g.tenant_id,
                    runs.c.pool == g.pool,
                    self.driver.json_equals(runs.c.requires, g.requires),
                )
                if reason is None:
                    if g.flagged:
                        cleared += await self._clear(conn, where)
                    continue
                waiting += g.old
                if g.old > g.flagged_with(reason):  # some runs do not know why they wait yet
                    started = await self._mark(conn, where, reason, cutoff)
                    marked += len(started)
                    events += [
                        event_row(
                            at=at,
                            kind="run.waiting",
                            tenant_id=g.tenant_id,
                            job_id=r.job_id,
                            run_id=r.id,
                            actor="scheduler",
                            reason=reason,
                            data={"pool": g.pool, "requires": list(g.requires)},
                        )
                        for r in started
                    ]
            await self._insert_events(conn, events)
        return RouteCheck(waiting=waiting, marked=marked, cleared=cleared)

    async def runs_unroutable(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[UnroutableRuns]:
        since = sa.func.min(runs.c.dispatched_at).label("since")
        stmt = (
            sa.select(
                runs.c.tenant_id,
                runs.c.pool,
                runs.c.requires,
                runs.c.wait_reason,
                sa.func.count().label("n"),
                since,
            )
            .where(runs.c.wait_reason.is_not(None), runs.c.state == _DISPATCHED)
            .group_by(runs.c.tenant_id, runs.c.pool, runs.c.requires, runs.c.wait_reason)
            .order_by(since, runs.c.pool)
            .limit(limit)
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            UnroutableRuns(
                tenant_id=r.tenant_id,
                pool=r.pool,
                requires=list(r.requires),
                reason=r.wait_reason,
                runs=int(r.n),
                since=r.since,
            )
            for r in rows
        ]

    # -- steps ---------------------------------------------------------------------

    async def _clear(self, conn: AsyncConnection, where: sa.ColumnElement[bool]) -> int:
        done = await conn.execute(
            runs.update()
            .where(_unlocked(where, runs.c.wait_reason.is_not(None)))
            .values(wait_reason=None)
        )
        return int(done.rowcount)

    async def _mark(
        self, conn: AsyncConnection, where: sa.ColumnElement[bool], reason: str, cutoff: datetime
    ) -> list[Any]:
        """Give ``reason`` to the runs of ``where`` dispatched by ``cutoff`` that do not
        have it yet; returns their ids and jobs."""
        stale = sa.or_(runs.c.wait_reason.is_(None), runs.c.wait_reason != reason)
        rows = await conn.execute(
            runs.update()
            .where(_unlocked(where, _waited_since(cutoff), stale))
            .values(wait_reason=reason)
            .returning(runs.c.id, runs.c.job_id)
        )
        return list(rows.all())

    async def _clear_stale(self, conn: AsyncConnection, in_shards: sa.ColumnElement[bool]) -> int:
        """Reasons left on runs that stopped waiting other than by a lease (cancel,
        pause): the partial index on waiting runs finds them."""
        done = await conn.execute(
            runs.update()
            .where(
                _unlocked(runs.c.wait_reason.is_not(None), runs.c.state != _DISPATCHED, in_shards)
            )
            .values(wait_reason=None)
        )
        return int(done.rowcount)

    async def _quarantine_groups(
        self,
        conn: AsyncConnection,
        in_shards: sa.ColumnElement[bool],
        poison: list[tuple[uuid.UUID, str, Any]],
        at: datetime,
    ) -> None:
        """Runs whose stored ``requires`` is not a list of capabilities: nothing can
        route them (nor lease them), so they leave the queue as quarantined."""
        found: dict[uuid.UUID, Poison] = {}
        for tenant_id, pool, requires in poison:
            rows = await conn.execute(
                sa.select(runs.c.id).where(
                    *_QUEUED,
                    in_shards,
                    runs.c.tenant_id == tenant_id,
                    runs.c.pool == pool,
                    self.driver.json_equals(runs.c.requires, requires),
                )
            )
            error = f"ValueError: requires is not a list of capabilities: {requires!r}"[:500]
            found.update({r.id: Poison("route", error) for r in rows})
        await self._quarantine(conn, found, at=at, actor="scheduler")

    async def _waiting_groups(
        self, conn: AsyncConnection, in_shards: sa.ColumnElement[bool], cutoff: datetime
    ) -> tuple[list[_Group], list[tuple[uuid.UUID, str, Any]]]:
        """The DISPATCHED runs of the shards by (tenant, pool, requires): how many have
        waited since ``cutoff`` or longer, and how many carry each reason. Groups with
        neither are left out. Second: the (tenant, pool, requires) of runs whose
        ``requires`` is no list of strings (a row no API wrote)."""
        old = sa.func.sum(sa.case((_waited_since(cutoff), 1), else_=0))
        rows = (
            await conn.execute(
                sa.select(
                    runs.c.tenant_id,
                    runs.c.pool,
                    runs.c.requires,
                    runs.c.wait_reason,
                    old.label("old"),
                    sa.func.count().label("n"),
                )
                .where(*_QUEUED, in_shards)
                .group_by(runs.c.tenant_id, runs.c.pool, runs.c.requires, runs.c.wait_reason)
                .having(sa.or_(old > 0, runs.c.wait_reason.is_not(None)))
            )
        ).all()
        groups: dict[tuple[uuid.UUID, str, tuple[str, ...]], _Group] = {}
        poison: list[tuple[uuid.UUID, str, Any]] = []
        for r in rows:
            if not isinstance(r.requires, list) or not all(isinstance(c, str) for c in r.requires):
                poison.append((r.tenant_id, r.pool, r.requires))
                continue
            key = (r.tenant_id, r.pool, tuple(r.requires))
            group = groups.setdefault(key, _Group(r.tenant_id, r.pool, key[2]))
            group.old += int(r.old or 0)
            if r.wait_reason is not None:
                group.reasons[r.wait_reason] = group.reasons.get(r.wait_reason, 0) + int(r.n)
        return list(groups.values()), poison

    async def _live_workers(
        self, conn: AsyncConnection, pools: set[str], at: datetime, ttl: float
    ) -> list[_LiveWorker]:
        holding = (
            sa.select(attempts.c.id)
            .where(
                attempts.c.worker_id == workers.c.id,
                attempts.c.state == AttemptState.RUNNING.value,
                attempts.c.lease_expires_at > at,
            )
            .exists()
        )
        rows = await conn.execute(
            sa.select(
                workers.c.tenant_id,
                workers.c.pool,
                workers.c.capabilities,
                workers.c.webhooks_only,
            ).where(
                workers.c.pool.in_(sorted(pools)),
                workers.c.deregistered_at.is_(None),
                sa.or_(workers.c.last_seen_at >= at - timedelta(seconds=ttl), holding),
            )
        )
        # A worker whose stored capabilities are no list of strings can take nothing
        # that requires any: it counts with none, rather than failing the check.
        return [
            _LiveWorker(
                r.tenant_id,
                r.pool,
                frozenset(r.capabilities)
                if isinstance(r.capabilities, list)
                and all(isinstance(c, str) for c in r.capabilities)
                else frozenset(),
                bool(r.webhooks_only),
            )
            for r in rows
        ]


@dataclass(slots=True)
class _Group:
    tenant_id: uuid.UUID
    pool: str
    requires: tuple[str, ...]
    old: int = 0  # runs that have waited min_wait or longer
    reasons: dict[str, int] = field(default_factory=dict)  # runs carrying each reason

    @property
    def flagged(self) -> int:
        return sum(self.reasons.values())

    def flagged_with(self, reason: str) -> int:
        return self.reasons.get(reason, 0)
