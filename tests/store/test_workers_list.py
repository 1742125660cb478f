"""Listing workers: what each runs, what it holds, whether it is live; scoped to the
workers serving a tenant (its own and the shared ones), by pool, page by page."""

from __future__ import annotations

import uuid

from cronwheel.domain.model import WorkerStatus
from cronwheel.store import Store

from .helpers import T0, at, dispatched_run, make_tenant, register_worker


def _by_id(items: list[WorkerStatus]) -> dict[object, WorkerStatus]:
    return {s.worker.id: s for s in items}


async def test_workers_list_shows_what_each_holds_and_whether_it_is_live(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    busy = await register_worker(store, tenant.id, tasks=["demo.task"], tags=["red"])
    run = await dispatched_run(store, tenant.id)
    assert [a.run_id for a in await store.attempts_lease(worker=busy, max=5, now=T0)] == [run.id]
    shared = await register_worker(store, None, pool="batch", now=at(50))
    gone = await register_worker(store, tenant.id, now=at(50))
    await store.workers_deregister(gone.id, now=at(51))
    theirs = await register_worker(store, other.id, now=at(50))

    page = await store.workers_list(None, worker_ttl=30.0, now=at(60))
    assert page.next_cursor is None
    listed = _by_id(page.items)
    assert set(listed) == {busy.id, shared.id, gone.id, theirs.id}
    # Seen at T0 only, but holding a live lease (25 s heartbeat timeout: until T0+25)...
    assert (listed[busy.id].running, listed[busy.id].reserved) == (1, 0)
    assert listed[busy.id].worker.tasks == ["demo.task"]
    assert listed[busy.id].worker.tags == ["red"]
    # ...which ran out by T0+60: not live any more.
    assert not listed[busy.id].live
    earlier = await store.workers_list(None, worker_ttl=30.0, now=at(20))
    assert _by_id(earlier.items)[busy.id].live
    assert listed[shared.id].live and listed[shared.id].worker.tasks is None
    assert not listed[gone.id].live and listed[gone.id].worker.deregistered_at == at(51)

    # A tenant sees its own workers and the shared ones, never another tenant's.
    mine = await store.workers_list(tenant.id, now=at(60))
    assert set(_by_id(mine.items)) == {busy.id, shared.id, gone.id}
    assert set(_by_id((await store.workers_list(other.id, now=at(60))).items)) == {
        theirs.id,
        shared.id,
    }
    batch = await store.workers_list(tenant.id, pool="batch", now=at(60))
    assert [s.worker.id for s in batch.items] == [shared.id]

    # A shared worker's work for another tenant is not told to this one.
    theirs_run = await dispatched_run(store, other.id, now=at(60), pool="batch")
    [leased] = await store.attempts_lease(worker=shared, max=5, now=at(60))
    assert leased.run_id == theirs_run.id

    async def running(tenant_id: uuid.UUID | None) -> int:
        page = await store.workers_list(tenant_id, pool="batch", now=at(61))
        [status] = page.items
        return status.running

    assert (await running(None), await running(other.id), await running(tenant.id)) == (1, 1, 0)


async def test_workers_list_pages(store: Store) -> None:
    tenant = await make_tenant(store)
    ids = [(await register_worker(store, tenant.id)).id for _ in range(5)]
    first = await store.workers_list(tenant.id, limit=3, now=T0)
    assert first.next_cursor is not None
    second = await store.workers_list(tenant.id, limit=3, cursor=first.next_cursor, now=T0)
    assert second.next_cursor is None
    assert [s.worker.id for s in [*first.items, *second.items]] == sorted(ids)
