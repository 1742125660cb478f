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
only that tenant), its capabilities include all the run requires, it runs the run's
task (a worker that declared no tasks runs any; a webhook run has none) and its tags
include all the run's route tags — the conditions leasing applies. Whether any live
worker is free is not the question: a busy capable worker will take the run later.

The reason names what no live worker of the pool has: ``no live worker in pool
'default' handles task 'ops.ping'``, ``… has tags ['red']``, or several joined by
"and" when only their combination is missing.

The check works on groups, never on single runs: one query groups the DISPATCHED runs
of the caller's shards by (tenant, pool, requires, route tags, task), one reads the
live workers of those pools, and one UPDATE per group whose reason changes. Runs locked
by someone else (being leased, cancelled) are skipped, never waited for: the next check
sees them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import RouteCheck, UnroutableRuns
from cronwheel.domain.spec import WEBHOOK_CAPABILITY
from cronwheel.domain.states import RunState
from cronwheel.store.rows import event_row
from cronwheel.store.schema import runs, workers
from cronwheel.store.sql.quarantine import Poison, QuarantineMixin
from cronwheel.store.sql.statements import workers_live

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
    tags: frozenset[str] = frozenset()
    tasks: frozenset[str] | None = None  # None: any task


def _unlocked(*where: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """The runs matching ``where`` that nobody else holds locked right now (a lease, a
    cancel, a result): the others wait for the next check, so the check never waits on
    a hot path, nor can it deadlock with one."""
    pick = sa.select(runs.c.id).where(*where).with_for_update(skip_locked=True)
    return runs.c.id.in_(pick.scalar_subquery())


def wait_reason(
    *,
    tenant_id: uuid.UUID,
    pool: str,
    requires: Sequence[str],
    live: Sequence[_LiveWorker],
    task: str | None = None,
    route_tags: Sequence[str] = (),
) -> str | None:
    """Why runs of ``tenant_id`` in ``pool`` requiring ``requires``, of ``task`` and
    routed by ``route_tags``, wait, or None when a live worker can take them. Only
    workers serving the tenant are considered, so the reason tells nothing about other
    tenants' workers."""
    need, tags = set(requires), set(route_tags)
    # Webhook runs require the webhook capability; any other run has a task, which a
    # worker that only calls webhooks cannot run.
    task_runs = WEBHOOK_CAPABILITY not in need
    candidates = [
        w
        for w in live
        if w.pool == pool
        and w.tenant_id in (None, tenant_id)
        and not (w.webhooks_only and task_runs)
    ]
    if not candidates:
        if not need:
            return f"no live worker in pool {pool!r}"
        return f"no live worker in pool {pool!r} has capabilities {sorted(need)!r}"
    # What a worker must have, in the order leasing's conditions are listed.
    steps: list[tuple[str, Callable[[_LiveWorker], bool]]] = []
    if need:
        steps.append((f"has capabilities {sorted(need)!r}", lambda w: need <= w.capabilities))
    if task is not None:
        steps.append((f"handles task {task!r}", lambda w: w.tasks is None or task in w.tasks))
    if tags:
        steps.append((f"has tags {sorted(tags)!r}", lambda w: tags <= w.tags))
    # The first requirement no candidate meets at all, alone...
    for words, can in steps:
        if not any(can(w) for w in candidates):
            return f"no live worker in pool {pool!r} {words}"
    # ...else each is met by some, and it is their combination that none meets: named
    # are those that ruled candidates out.
    narrowed: list[str] = []
    for words, can in steps:
        left = [w for w in candidates if can(w)]
        if len(left) < len(candidates):
            narrowed.append(words)
        candidates = left
    if candidates:
        return None
    return f"no live worker in pool {pool!r} " + " and ".join(narrowed)


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
                    tenant_id=g.tenant_id,
                    pool=g.pool,
                    requires=g.requires,
                    task=g.task,
                    route_tags=g.route_tags,
                    live=live,
                )
                where = sa.and_(*_QUEUED, in_shards, self._group_of(g))
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
                            data={
                                "pool": g.pool,
                                "requires": list(g.requires),
                                "task": g.task,
                                "route_tags": list(g.route_tags),
                            },
                        )
                        for r in started
                    ]
            await self._insert_events(conn, events)
        return RouteCheck(waiting=waiting, marked=marked, cleared=cleared)

    async def runs_unroutable(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[UnroutableRuns]:
        since = sa.func.min(runs.c.dispatched_at).label("since")
        key = (runs.c.tenant_id, runs.c.pool, runs.c.requires, runs.c.route_tags)
        stmt = (
            sa.select(*key, runs.c.wait_reason, sa.func.count().label("n"), since)
            .where(runs.c.wait_reason.is_not(None), runs.c.state == _DISPATCHED)
            .group_by(*key, runs.c.wait_reason)
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
                route_tags=list(r.route_tags),
            )
            for r in rows
        ]

    # -- steps ---------------------------------------------------------------------

    def _group_of(self, g: _Key | _Group) -> sa.ColumnElement[bool]:
        """The runs of one group (their tenant, pool, requires, route tags and task)."""
        return sa.and_(
            runs.c.tenant_id == g.tenant_id,
            runs.c.pool == g.pool,
            self.driver.json_equals(runs.c.requires, g.requires),
            self.driver.json_equals(runs.c.route_tags, g.route_tags),
            runs.c.task.is_(None) if g.task is None else runs.c.task == g.task,
        )

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
        poison: list[_Key],
        at: datetime,
    ) -> None:
        """Runs whose stored ``requires`` or ``route_tags`` is not a list of labels:
        nothing can route them (nor lease them), so they leave the queue as
        quarantined."""
        found: dict[uuid.UUID, Poison] = {}
        for g in poison:
            rows = await conn.execute(
                sa.select(runs.c.id).where(*_QUEUED, in_shards, self._group_of(g))
            )
            if not _labels(g.requires):
                error = f"ValueError: requires is not a list of capabilities: {g.requires!r}"
            else:
                error = f"ValueError: route_tags is not a list of tags: {g.route_tags!r}"
            found.update({r.id: Poison("route", error[:500]) for r in rows})
        await self._quarantine(conn, found, at=at, actor="scheduler")

    async def _waiting_groups(
        self, conn: AsyncConnection, in_shards: sa.ColumnElement[bool], cutoff: datetime
    ) -> tuple[list[_Group], list[_Key]]:
        """The DISPATCHED runs of the shards by (tenant, pool, requires, route tags,
        task): how many have waited since ``cutoff`` or longer, and how many carry each
        reason. Groups with neither are left out. Second: the groups whose ``requires``
        or ``route_tags`` is no list of strings (a row no API wrote)."""
        old = sa.func.sum(sa.case((_waited_since(cutoff), 1), else_=0))
        key = (runs.c.tenant_id, runs.c.pool, runs.c.requires, runs.c.route_tags, runs.c.task)
        rows = (
            await conn.execute(
                sa.select(*key, runs.c.wait_reason, old.label("old"), sa.func.count().label("n"))
                .where(*_QUEUED, in_shards)
                .group_by(*key, runs.c.wait_reason)
                .having(sa.or_(old > 0, runs.c.wait_reason.is_not(None)))
            )
        ).all()
        groups: dict[_Key, _Group] = {}
        poison: list[_Key] = []
        for r in rows:
            if not (_labels(r.requires) and _labels(r.route_tags)):
                poison.append(_Key(r.tenant_id, r.pool, r.requires, r.route_tags, r.task))
                continue
            k = _Key(r.tenant_id, r.pool, tuple(r.requires), tuple(r.route_tags), r.task)
            group = groups.setdefault(k, _Group(*k))
            group.old += int(r.old or 0)
            if r.wait_reason is not None:
                group.reasons[r.wait_reason] = group.reasons.get(r.wait_reason, 0) + int(r.n)
        return list(groups.values()), poison

    async def _live_workers(
        self, conn: AsyncConnection, pools: set[str], at: datetime, ttl: float
    ) -> list[_LiveWorker]:
        rows = await conn.execute(
            sa.select(
                workers.c.tenant_id,
                workers.c.pool,
                workers.c.capabilities,
                workers.c.webhooks_only,
                workers.c.tags,
                workers.c.tasks,
            ).where(workers.c.pool.in_(sorted(pools)), workers_live(at, ttl))
        )
        # A worker whose stored capabilities or tags are no list of strings can take
        # nothing that needs any: it counts with none, rather than failing the check;
        # stored tasks that are no list leave it running none.
        return [
            _LiveWorker(
                r.tenant_id,
                r.pool,
                frozenset(r.capabilities) if _labels(r.capabilities) else frozenset(),
                bool(r.webhooks_only),
                frozenset(r.tags) if _labels(r.tags) else frozenset(),
                None
                if r.tasks is None
                else frozenset(r.tasks)
                if _labels(r.tasks)
                else frozenset(),
            )
            for r in rows
        ]


def _labels(value: Any) -> bool:
    """``value`` (stored JSON) is a list of strings."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class _Key(NamedTuple):
    """What the runs of one group share: everything that decides who can take them."""

    tenant_id: uuid.UUID
    pool: str
    requires: Any  # a tuple of capabilities (anything, in a poison group)
    route_tags: Any  # a tuple of tags (anything, in a poison group)
    task: str | None


@dataclass(slots=True)
class _Group:
    tenant_id: uuid.UUID
    pool: str
    requires: tuple[str, ...]
    route_tags: tuple[str, ...]
    task: str | None
    old: int = 0  # runs that have waited min_wait or longer
    reasons: dict[str, int] = field(default_factory=dict)  # runs carrying each reason

    @property
    def flagged(self) -> int:
        return sum(self.reasons.values())

    def flagged_with(self, reason: str) -> int:
        return self.reasons.get(reason, 0)
