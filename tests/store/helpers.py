"""Shared steps of the store conformance suite: tenants, job specs, and moving runs
through their states with explicit instants, so every test reads as its scenario."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import Selector
from cronwheel.domain.model import Event, FiredRun, Job, LeasedAttempt, NewJob, Run, Tenant, Worker
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store
from cronwheel.store.schema import runs
from cronwheel.store.sql import SqlStore
from cronwheel.testing import wait_until_async

__all__ = [
    "ALL_SHARDS",
    "NODE",
    "T0",
    "at",
    "create_job",
    "create_jobs",
    "dispatched_run",
    "engine_of",
    "events_of",
    "fire",
    "hold_all_shards",
    "job_spec",
    "leased_run",
    "make_tenant",
    "new_job",
    "register_worker",
    "takes_in_order",
    "transitions_of",
    "until_lock_wait",
]

T = TypeVar("T")

# A fixed instant far from the real clock: a store that used its own clock where a
# test passed ``now`` would be caught by every assertion on times.
T0 = datetime(2031, 3, 4, 12, 0, 0, tzinfo=UTC)
NODE = "node-a"
ALL_SHARDS = list(range(NUM_SHARDS))

_names = itertools.count(1)


def at(seconds: float) -> datetime:
    """``T0`` plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def engine_of(store: Store) -> AsyncEngine:
    """The engine under a SQL store, for the few tests that must reach past the interface
    (to prove a database constraint holds on its own)."""
    assert isinstance(store, SqlStore)
    return store.engine


async def make_tenant(store: Store, name: str | None = None, **limits: Any) -> Tenant:
    return await store.tenants_create(
        name=name or f"tenant-{next(_names)}-{uuid.uuid4().hex[:6]}", limits=limits, now=T0
    )


def job_spec(**fields: Any) -> JobSpec:
    """A valid one-off task job; ``fields`` override any part of it."""
    body: dict[str, Any] = {
        "name": f"job-{next(_names)}",
        "schedule": {"at": T0.isoformat()},
        "task": "demo.task",
    }
    body.update(fields)
    return JobSpec.model_validate(body)


def new_job(
    spec: JobSpec | None = None,
    *,
    due_at: datetime | None = T0,
    idempotency_key: str | None = None,
    actor: Actor | None = Actor("tester", role="operator"),
    **fields: Any,
) -> NewJob:
    return NewJob(
        spec=spec or job_spec(**fields),
        first_due_at=due_at,
        idempotency_key=idempotency_key,
        actor=actor,
    )


async def create_job(
    store: Store,
    tenant_id: uuid.UUID,
    *,
    due_at: datetime = T0,
    now: datetime = T0,
    **fields: Any,
) -> tuple[Job, Run]:
    """Create one job with a first run; return both."""
    [(job, run, created)] = await store.jobs_create_many(
        tenant_id, jobs=[new_job(due_at=due_at, **fields)], now=now
    )
    assert created
    assert run is not None
    return job, run


async def create_jobs(
    store: Store, tenant_id: uuid.UUID, count: int, *, due_at: datetime = T0, **fields: Any
) -> list[Run]:
    """``count`` jobs in one batch; return their first runs in order."""
    out = await store.jobs_create_many(
        tenant_id, jobs=[new_job(due_at=due_at, **fields) for _ in range(count)], now=T0
    )
    runs = [run for _job, run, _created in out]
    assert all(run is not None for run in runs)
    return [run for run in runs if run is not None]


async def hold_all_shards(
    store: Store, node_id: str = NODE, *, now: datetime = T0, ttl: float = 3600.0
) -> dict[int, int]:
    held = await store.shard_leases_acquire(node_id=node_id, shards=ALL_SHARDS, ttl=ttl, now=now)
    assert sorted(held) == ALL_SHARDS
    return held


async def fire(
    store: Store, runs: Sequence[Run], *, now: datetime = T0, node_id: str = NODE
) -> list[FiredRun]:
    """Fire ``runs`` as ``node_id``, taking their shards' leases first."""
    shards = sorted({r.shard for r in runs})
    held = await store.shard_leases_acquire(node_id=node_id, shards=shards, ttl=3600, now=now)
    assert set(shards) <= set(held)
    return await store.runs_fire(run_ids=[r.id for r in runs], node_id=node_id, now=now)


async def dispatched_run(
    store: Store, tenant_id: uuid.UUID, *, now: datetime = T0, **fields: Any
) -> Run:
    """A run created due at ``now`` and fired: DISPATCHED, ready to lease."""
    _job, run = await create_job(store, tenant_id, due_at=now, now=now, **fields)
    fired = await fire(store, [run], now=now)
    assert [f.id for f in fired] == [run.id]
    return await store.runs_get(tenant_id, run.id)


async def register_worker(
    store: Store,
    tenant_id: uuid.UUID | None = None,
    *,
    pool: str = "default",
    capabilities: Sequence[str] = (),
    tags: Sequence[str] = (),
    tasks: Sequence[str] | None = None,
    now: datetime = T0,
) -> Worker:
    return await store.workers_register(
        tenant_id,
        pool=pool,
        capabilities=capabilities,
        tags=tags,
        capacity=100,
        tasks=tasks,
        now=now,
    )


async def leased_run(
    store: Store,
    tenant_id: uuid.UUID,
    *,
    now: datetime = T0,
    worker: Worker | None = None,
    **fields: Any,
) -> tuple[Run, LeasedAttempt]:
    """A run created, fired and leased by one worker: RUNNING with one live attempt."""
    run = await dispatched_run(store, tenant_id, now=now, **fields)
    worker = worker or await register_worker(store, tenant_id, pool=run.pool)
    leased = await store.attempts_lease(worker=worker, max=1, now=now)
    assert [a.run_id for a in leased] == [run.id]
    return await store.runs_get(tenant_id, run.id), leased[0]


async def events_of(store: Store, tenant_id: uuid.UUID, *, run_id: uuid.UUID) -> list[Event]:
    page = await store.events_list(tenant_id, run_id=run_id, limit=1000)
    assert page.next_cursor is None
    return page.items


async def transitions_of(
    store: Store, tenant_id: uuid.UUID, run_id: uuid.UUID
) -> list[tuple[str | None, str | None]]:
    """The run's recorded ``(from_state, to_state)`` pairs, oldest first."""
    return [
        (e.from_state, e.to_state)
        for e in await events_of(store, tenant_id, run_id=run_id)
        if e.kind == "run.transition"
    ]


async def until_lock_wait(
    watcher: AsyncConnection, task: asyncio.Task[Any], what: str, *, waiting: int = 1
) -> None:
    """Wait until ``waiting`` sessions of this database wait on a row lock (``task``'s
    among them, which must not have ended meanwhile). PostgreSQL only."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )

    async def blocked() -> bool:
        assert not task.done(), f"it went ahead instead of waiting: {what}"
        try:  # activity is read once per transaction: each reading in one of its own
            return int((await watcher.execute(query)).scalar_one()) >= waiting
        finally:
            await watcher.rollback()

    await wait_until_async(blocked, 10, what=what)
    assert not task.done()


async def takes_in_order(
    store: Store, first: uuid.UUID, then: uuid.UUID, act: Coroutine[Any, Any, T]
) -> T:
    """That ``act`` takes the run ``first`` before ``then``: another transaction holds
    ``first`` and is about to take ``then``, as a path locking both in that order would;
    ``act`` must wait on ``first`` holding nothing, so the other one takes ``then``
    without waiting (a lock ``act`` held there fails it: NOWAIT), commits, and ``act``
    goes on. Returns what ``act`` returned. PostgreSQL only."""
    engine = engine_of(store)
    async with engine.connect() as other, engine.connect() as watcher:
        await other.begin()
        await other.execute(sa.select(runs.c.id).where(runs.c.id == first).with_for_update())
        task = asyncio.create_task(act)
        try:
            await until_lock_wait(watcher, task, "waiting on the first run's lock")
            locked = await other.execute(
                sa.select(runs.c.id).where(runs.c.id == then).with_for_update(nowait=True)
            )
            assert locked.scalar_one() == then
            await other.commit()
            return await asyncio.wait_for(task, timeout=10)
        finally:
            if not task.done():
                task.cancel()


async def collide(
    store: Store,
    hold: sa.Executable,
    first: Coroutine[Any, Any, Any],
    second: Coroutine[Any, Any, Any],
    *,
    what: tuple[str, str],
) -> list[Any]:
    """Two store calls made to meet in the order that shows whether their locks can form
    a cycle: ``hold`` taken by a transaction of its own, so that ``first`` waits on it
    (or on something behind it); ``second`` started and left to wait too — or to end
    without waiting, as a store taking its locks in order may; then the hold let go.
    Returns both outcomes, an exception for a call that failed. PostgreSQL only."""
    engine = engine_of(store)
    async with engine.connect() as holder, engine.connect() as watcher:
        await holder.begin()
        await holder.execute(hold)
        one = asyncio.create_task(first)
        two: asyncio.Task[Any] | None = None
        try:
            await until_lock_wait(watcher, one, what[0])
            two = asyncio.create_task(second)
            waiting = sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )

            async def settled() -> bool:
                assert two is not None
                assert not one.done(), f"it went ahead instead of waiting: {what[0]}"
                if two.done():
                    return True
                try:  # activity is read once per transaction: each reading its own
                    return int((await watcher.execute(waiting)).scalar_one()) >= 2
                finally:
                    await watcher.rollback()

            await wait_until_async(settled, 10, what=what[1])
            await holder.commit()
            return list(
                await asyncio.wait_for(asyncio.gather(one, two, return_exceptions=True), 30)
            )
        finally:
            for task in (one, two):
                if task is not None and not task.done():
                    task.cancel()
            if two is None:  # never started: no "never awaited" warning
                second.close()


def no_failures(outcomes: Sequence[Any], names: tuple[str, str]) -> None:
    """Neither call failed (a deadlock fails one of them)."""
    failed = [
        f"{name}: {type(o).__name__}: {str(getattr(o.__cause__, 'orig', o)).splitlines()[0]}"
        for name, o in zip(names, outcomes, strict=True)
        if isinstance(o, BaseException)
    ]
    assert not failed, "\n".join(failed)


async def claimed_bulk_cancel(
    store: Store, tenant_id: uuid.UUID, run_ids: Sequence[uuid.UUID], *, now: datetime
) -> uuid.UUID:
    """A bulk cancel of ``run_ids`` made and claimed by ``api-1``: its id, for
    ``operations_step(id, owner="api-1", ttl=30)``."""
    op = await store.operations_create(
        tenant_id,
        action="cancel",
        selector=Selector(run_ids=tuple(run_ids)),
        actor=Actor("k-ops", role="operator"),
        now=now,
    )
    await store.operations_claim(owner="api-1", ttl=30, now=now)
    return op.id
