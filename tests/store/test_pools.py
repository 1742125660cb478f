"""Pools: the P0 share an admin sets, what each pool's live workers can take now, and
the backlog waiting for them — as the admin sees it and as one tenant does."""

from __future__ import annotations

import uuid

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.pools import PoolStatus
from cronwheel.store import Store

from .helpers import T0, at, create_job, dispatched_run, fire, make_tenant, register_worker


def _by_name(statuses: list[PoolStatus]) -> dict[str, PoolStatus]:
    return {s.name: s for s in statuses}


def _backlog(status: PoolStatus) -> dict[tuple[str, int], tuple[int, int]]:
    return {(b.tenant_name, b.priority): (b.ready, b.due) for b in status.backlog}


async def test_pools_set_and_get_record_who_changed_what(store: Store) -> None:
    never = await store.pools_get("gpu")
    assert (never.name, never.p0_reserved_share, never.updated_at) == ("gpu", None, None)

    first = await store.pools_set("gpu", p0_reserved_share=0.25, actor=Actor("admin"), now=at(1))
    assert (first.p0_reserved_share, first.updated_at) == (0.25, at(1))
    again = await store.pools_set("gpu", p0_reserved_share=None, actor=Actor("admin"), now=at(2))
    assert again.p0_reserved_share is None
    read = await store.pools_get("gpu")
    assert (read.p0_reserved_share, read.updated_at) == (None, at(2))

    page = await store.events_list(None, limit=100)
    events = [e for e in page.items if e.kind == "pool.updated"]
    assert [(e.actor, e.data) for e in events] == [
        ("admin", {"pool": "gpu", "p0_reserved_share": 0.25, "previous": None}),
        ("admin", {"pool": "gpu", "p0_reserved_share": None, "previous": 0.25}),
    ]


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
async def test_pools_set_refuses_a_share_out_of_range(store: Store, share: float) -> None:
    with pytest.raises(ValidationError) as caught:
        await store.pools_set("gpu", p0_reserved_share=share, now=T0)
    assert caught.value.field == "p0_reserved_share"
    assert (await store.pools_get("gpu")).updated_at is None


async def test_pools_capacity_counts_live_workers_and_what_they_hold(store: Store) -> None:
    tenant = await make_tenant(store)
    busy = await register_worker(store, tenant.id)  # capacity 100
    for _ in range(3):
        await dispatched_run(store, tenant.id)
    assert len(await store.attempts_lease(worker=busy, max=2, now=T0)) == 2
    await register_worker(store, None)  # shared, idle
    small = await store.workers_register(
        None, pool="gpu", capabilities=[], tags=[], capacity=10, now=T0
    )
    gone = await register_worker(store, None, pool="gpu")
    await store.workers_deregister(gone.id, now=T0)
    await store.pools_set("gpu", p0_reserved_share=0.3, now=T0)

    caps = await store.pools_capacity(default_share=0.1, worker_ttl=30.0, now=at(1))
    assert set(caps) == {"default", "gpu"}
    default = caps["default"]
    assert (default.workers, default.capacity, default.busy, default.free) == (2, 200, 2, 198)
    assert (default.p0_reserved_share, default.p0_reserved_slots) == (0.1, 20)
    # The tenant's own worker takes only its runs; the shared one anyone's.
    assert default.free_by_owner == {tenant.id: 98, None: 100}
    assert default.free_for(tenant.id) == 198
    assert default.free_for(uuid.uuid4()) == 100
    gpu = caps["gpu"]
    assert (gpu.workers, gpu.capacity, gpu.busy, gpu.free) == (1, 10, 0, 10)
    assert (gpu.p0_reserved_share, gpu.p0_reserved_slots) == (0.3, 3)

    # Past the TTL the idle workers are gone; the busy one still holds a live lease.
    later = await store.pools_capacity(worker_ttl=30.0, now=at(20))
    assert later["default"].workers == 2
    late = await store.pools_capacity(worker_ttl=30.0, now=at(100))
    assert late == {}
    assert small.capacity == 10


async def test_pools_capacity_counts_reservations_and_never_below_zero(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await store.workers_register(
        tenant.id, pool="default", capabilities=[], tags=[], capacity=2, now=T0
    )
    for _ in range(2):
        await dispatched_run(store, tenant.id)
    _job, ahead = await create_job(store, tenant.id, due_at=at(2), now=T0)
    # Fired ahead and leased ahead: a reservation takes a slot too.
    await fire(store, [ahead], now=at(2))
    leased = await store.attempts_lease(worker=worker, max=3, ahead=5.0, now=T0)
    assert len(leased) == 3
    [status] = (await store.pools_capacity(now=at(1))).values()
    assert (status.capacity, status.busy, status.free) == (2, 3, 0)


async def test_pools_status_shows_backlog_by_tenant_and_class(store: Store) -> None:
    a = await make_tenant(store, name="alpha")
    b = await make_tenant(store, name="beta")
    await register_worker(store, a.id)  # alpha's own
    await register_worker(store, None, pool="batch")  # shared
    await register_worker(store, b.id, pool="secret")  # beta's own
    for _ in range(3):
        await dispatched_run(store, a.id, priority=2)
    await dispatched_run(store, b.id, priority=0)
    await dispatched_run(store, b.id, priority=0, pool="secret")
    # Due and not fired yet (SCHEDULED, fire time come), and one not due yet.
    await create_job(store, a.id, due_at=at(-5), priority=3)
    await create_job(store, b.id, due_at=at(3600), priority=3)
    await create_job(store, b.id, due_at=at(-5), priority=1, pool="quiet")  # nothing ready

    every = _by_name(await store.pools_status(None, default_share=0.1, now=at(1)))
    assert set(every) == {"default", "batch", "secret", "quiet"}
    default = every["default"]
    assert _backlog(default) == {("beta", 0): (1, 0), ("alpha", 2): (3, 0), ("alpha", 3): (0, 1)}
    assert [b.priority for b in default.backlog] == [0, 2, 3]  # P0 first
    assert (default.ready, default.due) == (4, 1)
    assert (default.workers, default.capacity, default.free) == (1, 100, 100)
    assert (default.p0_reserved_share, default.effective_share) == (None, 0.1)
    assert default.p0_reserved_slots == 10
    assert every["batch"].backlog == []

    # Alpha sees its own backlog and the workers serving it: never beta's numbers, nor
    # the pool only beta uses.
    mine = _by_name(await store.pools_status(a.id, now=at(1)))
    assert set(mine) == {"default", "batch"}
    assert _backlog(mine["default"]) == {("alpha", 2): (3, 0), ("alpha", 3): (0, 1)}
    assert mine["default"].free is None
    theirs = _by_name(await store.pools_status(b.id, now=at(1)))
    assert set(theirs) == {"default", "batch", "secret", "quiet"}
    assert _backlog(theirs["default"]) == {("beta", 0): (1, 0)}
    assert _backlog(theirs["quiet"]) == {("beta", 1): (0, 1)}
    assert theirs["default"].workers == 0  # alpha's worker does not serve beta

    # Named pools are told whatever they hold.
    [empty] = await store.pools_status(a.id, names=["nothing"], now=at(1))
    assert (empty.name, empty.workers, empty.backlog) == ("nothing", 0, [])
    [secret] = await store.pools_status(a.id, names=["secret"], now=at(1))
    assert (secret.workers, secret.backlog) == (0, [])


async def test_pools_status_busy_counts_only_the_tenants_own_runs(store: Store) -> None:
    a, b = await make_tenant(store), await make_tenant(store)
    shared = await register_worker(store, None)
    await dispatched_run(store, a.id)
    await dispatched_run(store, b.id)
    await dispatched_run(store, b.id)
    assert len(await store.attempts_lease(worker=shared, max=10, now=T0)) == 3
    [every] = await store.pools_status(None, now=at(1))
    assert (every.busy, every.free) == (3, 97)
    [mine] = await store.pools_status(a.id, now=at(1))
    assert (mine.busy, mine.free, mine.capacity) == (1, None, 100)


async def test_pools_capacity_reads_the_database_clock(store: Store) -> None:
    """Without ``now``, liveness is judged by the database clock (read inside the
    statement where the database can)."""
    await store.workers_register(None, pool="clocked", capabilities=[], tags=[], capacity=3)
    caps = await store.pools_capacity(worker_ttl=30.0)
    assert (caps["clocked"].workers, caps["clocked"].free) == (1, 3)
    [status] = await store.pools_status(None, names=["clocked"], worker_ttl=30.0)
    assert (status.workers, status.capacity) == (1, 3)
