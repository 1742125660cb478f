"""Overrides racing other transactions on PostgreSQL, each interleaving forced with row
locks and hooks rather than hoped for (SQLite runs one write transaction at a time:
nothing can overlap there).

An override locks the job's live runs, then the job. A run made meanwhile by a
transaction that held the job and not the runs — a trigger — commits after the runs
were locked: the override still reaches it (it reads the runs again), and must lock it
before it changes it, or the run can be fired, leased and started in between and be
rewritten after its worker was handed the old payload."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import Job, Run
from cronwheel.domain.overrides import OverrideScope
from cronwheel.domain.states import RunState
from cronwheel.store import RunFilter, Store
from cronwheel.store.sql import overlay
from cronwheel.testing import wait_until_async

from .helpers import at, engine_of, hold_all_shards, make_tenant, register_worker, until_lock_wait
from .test_overrides import minutely
from .test_worker_deregistered import _postgres_only


async def test_a_run_triggered_while_an_override_waits_is_locked_before_it_is_changed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _postgres_only(store)
    tenant = await make_tenant(store)
    job, _run = await minutely(store, tenant.id)
    worker = await register_worker(store, tenant.id)
    await hold_all_shards(store, now=at(5))
    engine = engine_of(store)

    # The trigger holds the job, its run written, until released.
    written, release = asyncio.Event(), asyncio.Event()
    runs_by_id = store._runs_by_id  # type: ignore[attr-defined]

    async def holding(*args: Any, **kwargs: Any) -> Any:
        found = await runs_by_id(*args, **kwargs)
        written.set()
        await release.wait()
        return found

    monkeypatch.setattr(store, "_runs_by_id", holding)
    trigger = asyncio.create_task(store.jobs_trigger(tenant.id, job.id, now=at(5)))
    await asyncio.wait_for(written.wait(), 10)
    monkeypatch.undo()

    # Once the override has read the runs it will change, the triggered run is fired
    # and leased from other sessions — or they wait for the override, if it locked the
    # run.
    leasing: list[asyncio.Task[Any]] = []
    by_id = overlay.overrides_by_id

    async def fire_and_lease() -> Any:
        [made] = [r for r in await runs_of(store, job) if r.origin == "trigger"]
        await store.runs_fire(run_ids=[made.id], node_id="node-a", now=at(5))
        return await store.attempts_lease(worker=worker, max=10, now=at(5))

    async def racing(*args: Any, **kwargs: Any) -> Any:
        if not leasing:
            leasing.append(asyncio.create_task(fire_and_lease()))
            async with engine.connect() as watcher:
                await until_done_or_blocked(watcher, leasing[0])
        return await by_id(*args, **kwargs)

    monkeypatch.setattr(overlay, "overrides_by_id", racing)
    override = asyncio.create_task(
        store.overrides_create(
            tenant.id, scope=OverrideScope.FUTURE, job_id=job.id, payload={"f": 1}, now=at(5)
        )
    )
    async with engine.connect() as watcher:
        await until_lock_wait(
            watcher, override, "the override waiting on the job the trigger holds"
        )
    release.set()
    triggered = await asyncio.wait_for(trigger, 10)
    made, _reached = await asyncio.wait_for(override, 10)
    [leased] = await asyncio.wait_for(leasing[0], 10)

    # The override locked the run first: firing and leasing waited, and the worker was
    # handed what the run records — the override's payload.
    assert leased.run_id == triggered.id
    run = await store.runs_get(tenant.id, triggered.id)
    assert (run.state, run.attempt) == (RunState.RUNNING, 1)
    assert leased.payload == run.payload == {**triggered.payload, "f": 1}
    assert run.override_ids == [made.id]


async def runs_of(store: Store, job: Job) -> list[Run]:
    page = await store.runs_list(job.tenant_id, filter=RunFilter(job_id=job.id), limit=100)
    return list(page.items)


async def until_done_or_blocked(watcher: AsyncConnection, task: asyncio.Task[Any]) -> None:
    """Wait until ``task`` is done or some session of this database waits on a lock."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )

    async def settled() -> bool:
        if task.done():
            return True
        try:
            return int((await watcher.execute(query)).scalar_one()) > 0
        finally:
            await watcher.rollback()

    await wait_until_async(settled, 10, what="the lease done or waiting on a lock")
