"""A deregistered worker leases and starts nothing, whatever the API node believes: the
store decides inside its statements, and orders a lease racing the deregistration."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa

from cronwheel.domain.errors import NotFoundError, WorkerDeregisteredError
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import Store
from cronwheel.store.schema import workers

from .helpers import (
    T0,
    at,
    create_job,
    dispatched_run,
    engine_of,
    hold_all_shards,
    make_tenant,
    register_worker,
    until_lock_wait,
)


async def test_a_deregistered_worker_leases_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run = await dispatched_run(store, tenant.id)
    await store.workers_deregister(worker.id, now=at(1))

    # ``worker`` is the record as it was before: what a stale cache holds.
    with pytest.raises(WorkerDeregisteredError) as refused:
        await store.attempts_lease(worker=worker, max=10, now=at(2))
    assert (refused.value.status, refused.value.code) == (410, "worker_deregistered")
    with pytest.raises(WorkerDeregisteredError):
        await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(2))
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt) == (RunState.DISPATCHED, 0)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []
    # Not seen either: the lease changed nothing of the worker.
    assert (await store.workers_get(worker.id)).last_seen_at == T0
    # Any other worker still leases the run.
    other = await register_worker(store, tenant.id)
    [leased] = await store.attempts_lease(worker=other, max=10, now=at(2))
    assert leased.run_id == run.id


async def test_a_deregistered_worker_starts_none_of_its_reservations(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    _job, run = await create_job(store, tenant.id, due_at=at(3), now=T0)
    await hold_all_shards(store)
    await store.runs_fire(run_ids=[run.id], node_id="node-a", now=T0, lead=5)
    [reserved] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=T0)
    await store.workers_deregister(worker.id, now=at(1))

    with pytest.raises(WorkerDeregisteredError):
        await store.attempts_start_many(
            worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3)
        )
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt, after.started_at) == (RunState.DISPATCHED, 0, None)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []


async def test_a_lease_waits_for_a_deregistration_in_flight_and_gets_nothing(
    store: Store,
) -> None:
    """The deregistration holds the worker's row, uncommitted, when the lease comes: the
    lease must wait for it and then lease nothing — never go ahead on the old row."""
    _postgres_only(store)
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run = await dispatched_run(store, tenant.id)
    engine = engine_of(store)
    async with engine.connect() as conn, engine.connect() as watcher:
        deregistering = await conn.begin()
        await conn.execute(
            workers.update().where(workers.c.id == worker.id).values(deregistered_at=at(1))
        )
        lease = asyncio.create_task(store.attempts_lease(worker=worker, max=10, now=at(1)))
        await until_lock_wait(watcher, lease, "the lease waiting on the worker's row")
        await deregistering.commit()

        with pytest.raises(WorkerDeregisteredError):
            await asyncio.wait_for(lease, timeout=10)
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt) == (RunState.DISPATCHED, 0)


async def test_a_deregistration_waits_for_a_lease_in_flight_and_releases_its_runs(
    store: Store,
) -> None:
    """The other order: a lease holds the worker's row (here, as the lease statement
    does, share-locked in an open transaction) when the deregistration comes. It waits
    for the lease to commit, so the release after it finds the runs leased."""
    _postgres_only(store)
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run = await dispatched_run(store, tenant.id)
    engine = engine_of(store)
    async with engine.connect() as conn, engine.connect() as watcher:
        leasing = await conn.begin()
        await conn.execute(
            sa.select(workers.c.id).where(workers.c.id == worker.id).with_for_update(read=True)
        )
        deregister = asyncio.create_task(store.workers_deregister(worker.id, now=at(1)))
        await until_lock_wait(watcher, deregister, "the deregistration waiting on the worker's row")
        # Meanwhile the lease goes on in another transaction and commits first.
        [leased] = await store.attempts_lease(worker=worker, max=10, now=at(1))
        await leasing.commit()
        await asyncio.wait_for(deregister, timeout=10)

    [released] = await store.attempts_release_by_worker(worker_id=worker.id, now=at(2))
    assert released.attempt_id == leased.attempt_id
    assert (await store.attempts_get(leased.attempt_id)).state is AttemptState.RELEASED
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.DISPATCHED
    with pytest.raises(WorkerDeregisteredError):
        await store.attempts_lease(worker=worker, max=10, now=at(2))


def _postgres_only(store: Store) -> None:
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")


async def test_leasing_for_an_unknown_worker_is_not_found(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    await dispatched_run(store, tenant.id)
    stranger = type(worker)(
        id=uuid.uuid4(),
        tenant_id=tenant.id,
        pool=worker.pool,
        capabilities=[],
        tags=[],
        capacity=1,
        registered_at=T0,
        last_seen_at=T0,
    )
    with pytest.raises(NotFoundError):
        await store.attempts_lease(worker=stranger, max=10, now=at(1))
    with pytest.raises(NotFoundError):
        await store.attempts_start_many(worker_id=stranger.id, tokens=[1], now=at(1))
