"""Admission at lease time, on both backends: priority classes and the P0 reserve,
tenant limits (runs held, dispatch rate), weighted fair share — and on PostgreSQL,
that concurrent leases never give a tenant more than its limit."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from cronwheel.domain.model import LeasedAttempt, Tenant, Worker
from cronwheel.metrics import RUNS_THROTTLED
from cronwheel.store import CompleteItem, Store
from cronwheel.store.schema import pools, runs
from cronwheel.store.sql import SqlStore

from .helpers import NODE, T0, at, create_jobs, engine_of, fire, hold_all_shards, make_tenant


async def _ready(store: Store, tenant: Tenant, count: int, *, priority: int = 2) -> None:
    made = await create_jobs(store, tenant.id, count, priority=priority)
    await fire(store, made, now=T0)


async def _worker(store: Store, *, capacity: int = 100, pool: str = "default") -> Worker:
    return await store.workers_register(
        None, pool=pool, capabilities=(), tags=(), capacity=capacity, now=T0
    )


async def _complete(store: Store, leased: Sequence[LeasedAttempt], now: datetime) -> None:
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token) for a in leased], now=now
    )


def _by_tenant(leased: Sequence[LeasedAttempt]) -> Counter[uuid.UUID]:
    return Counter(a.tenant_id for a in leased)


async def _holding(store: Store, tenant_id: uuid.UUID) -> int:
    """Runs the tenant holds leased or running, straight from the table."""
    async with engine_of(store).connect() as conn:
        held = sa.or_(
            runs.c.state == "RUNNING",
            sa.and_(runs.c.state == "DISPATCHED", runs.c.reserved_token.isnot(None)),
        )
        return int(
            (
                await conn.execute(
                    sa.select(sa.func.count()).where(runs.c.tenant_id == tenant_id, held)
                )
            ).scalar_one()
        )


async def test_p0_runs_of_any_tenant_go_before_lower_classes(store: Store) -> None:
    flood, billing = await make_tenant(store), await make_tenant(store)
    await _ready(store, flood, 30, priority=2)
    await _ready(store, billing, 3, priority=0)
    worker = await _worker(store)
    leased = await store.attempts_lease(worker=worker, max=5, now=at(1))
    assert _by_tenant(leased) == {billing.id: 3, flood.id: 2}
    assert [a.tenant_id for a in leased[:3]] == [billing.id] * 3


async def test_lower_classes_leave_the_p0_reserve_of_each_worker(store: Store) -> None:
    flood = await make_tenant(store)
    await _ready(store, flood, 30, priority=1)
    worker = await _worker(store, capacity=10)
    # The setting: 20 % of 10 slots stay for P0.
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1), p0_share=0.2)
    assert len(leased) == 8
    # With 2 slots free, only P0 may take them.
    assert await store.attempts_lease(worker=worker, max=2, now=at(1), p0_share=0.2) == []
    billing = await make_tenant(store)
    await _ready(store, billing, 5, priority=0)
    leased = await store.attempts_lease(worker=worker, max=2, now=at(1), p0_share=0.2)
    assert _by_tenant(leased) == {billing.id: 2}


async def test_a_pools_own_share_overrides_the_setting(store: Store) -> None:
    flood = await make_tenant(store)
    await _ready(store, flood, 30, priority=3)
    async with engine_of(store).begin() as conn:
        await conn.execute(
            pools.insert().values(name="default", p0_reserved_share=0.5, updated_at=T0)
        )
    worker = await _worker(store, capacity=10)
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1), p0_share=0.0)
    assert len(leased) == 5


async def test_a_tenant_never_holds_more_than_its_max_concurrent_runs(store: Store) -> None:
    capped = await make_tenant(store, max_concurrent_runs=3)
    other = await make_tenant(store)
    await _ready(store, capped, 20)
    await _ready(store, other, 20)
    worker = await _worker(store)
    before = RUNS_THROTTLED.labels(tenant=capped.name, limit="max_concurrent_runs")._value.get()
    first = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert _by_tenant(first)[capped.id] == 3
    assert _by_tenant(first)[other.id] == 7  # the others get what it may not take
    assert (
        RUNS_THROTTLED.labels(tenant=capped.name, limit="max_concurrent_runs")._value.get()
        == before + 1
    )
    assert _by_tenant(await store.attempts_lease(worker=worker, max=10, now=at(2)))[capped.id] == 0
    # One finishes: one more may start, at once.
    await _complete(store, [a for a in first if a.tenant_id == capped.id][:1], now=at(3))
    again = await store.attempts_lease(worker=worker, max=10, now=at(4))
    assert _by_tenant(again)[capped.id] == 1
    assert await _holding(store, capped.id) == 3


async def test_reservations_count_against_max_concurrent_runs(store: Store) -> None:
    capped = await make_tenant(store, max_concurrent_runs=2)
    made = await create_jobs(store, capped.id, 5, due_at=at(3))
    await hold_all_shards(store)
    fired = await store.runs_fire(run_ids=[r.id for r in made], node_id=NODE, now=at(1), lead=5)
    assert len(fired) == 5  # dispatched ahead of their instant
    worker = await _worker(store)
    reserved = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(1))
    assert len(reserved) == 2 and all(a.not_before is not None for a in reserved)
    assert await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(2)) == []
    assert await _holding(store, capped.id) == 2


async def test_the_dispatch_rate_is_a_token_bucket_every_lease_draws_on(store: Store) -> None:
    rated = await make_tenant(store, max_dispatch_rate=2.0, dispatch_burst=3)
    await _ready(store, rated, 20)
    worker = await _worker(store)
    assert len(await store.attempts_lease(worker=worker, max=10, now=at(1))) == 3  # the burst
    assert await store.attempts_lease(worker=worker, max=10, now=at(1.2)) == []
    assert len(await store.attempts_lease(worker=worker, max=10, now=at(1.5))) == 1
    assert len(await store.attempts_lease(worker=worker, max=10, now=at(3))) == 3  # refilled
    # A second worker draws on the same bucket.
    second = await _worker(store)
    assert await store.attempts_lease(worker=second, max=10, now=at(3)) == []
    assert len(await store.attempts_lease(worker=second, max=10, now=at(3.5))) == 1


async def test_weights_share_a_contended_pool(store: Store) -> None:
    light = await make_tenant(store, weight=1.0)
    heavy = await make_tenant(store, weight=3.0)
    await _ready(store, light, 200)
    await _ready(store, heavy, 200)
    worker = await _worker(store)
    got: Counter[uuid.UUID] = Counter()
    for i in range(40):  # 40 leases of 4 slots, each batch finished before the next
        leased = await store.attempts_lease(worker=worker, max=4, now=at(1 + i))
        got += _by_tenant(leased)
        await _complete(store, leased, now=at(1 + i))
    assert got[light.id] + got[heavy.id] == 160
    assert got[light.id] == 40 and got[heavy.id] == 120


async def test_a_tenant_alone_takes_everything_and_a_newcomer_gets_its_share_at_once(
    store: Store,
) -> None:
    first = await make_tenant(store)
    await _ready(store, first, 100)
    worker = await _worker(store)
    for i in range(5):
        leased = await store.attempts_lease(worker=worker, max=4, now=at(1 + i))
        assert _by_tenant(leased) == {first.id: 4}
        await _complete(store, leased, now=at(1 + i))
    newcomer = await make_tenant(store)
    await _ready(store, newcomer, 100)
    leased = await store.attempts_lease(worker=worker, max=4, now=at(10))
    assert _by_tenant(leased) == {first.id: 2, newcomer.id: 2}


async def test_a_tenant_worker_is_served_its_own_tenant_within_its_limits(store: Store) -> None:
    own = await make_tenant(store, max_concurrent_runs=2)
    await _ready(store, own, 5)
    await _ready(store, await make_tenant(store), 5)
    worker = await store.workers_register(
        own.id, pool="default", capabilities=(), tags=(), capacity=10, now=T0
    )
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert _by_tenant(leased) == {own.id: 2}


async def test_concurrent_leases_never_exceed_a_tenants_limit(pg_url: str) -> None:
    """Many workers leasing at once, over several connections: the advisory locks make
    each lease see what the others committed."""
    from cronwheel.store import create_store

    store = create_store(pg_url, pool_size=8, pool_overflow=0)
    await store.open()
    try:
        assert isinstance(store, SqlStore)
        capped = await make_tenant(store, max_concurrent_runs=5)
        other = await make_tenant(store)
        await _ready(store, capped, 200)
        await _ready(store, other, 200)
        workers = [await _worker(store) for _ in range(8)]
        for round_ in range(5):
            batches = await asyncio.gather(
                *(store.attempts_lease(worker=w, max=3, now=at(1 + round_)) for w in workers)
            )
            assert await _holding(store, capped.id) <= 5
            leased = [a for b in batches for a in b]
            await _complete(store, leased, now=at(1 + round_))
        assert await _holding(store, capped.id) == 0
    finally:
        await store.close()
