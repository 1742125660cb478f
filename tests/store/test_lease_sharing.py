"""Leases woken together by one notice share a large batch of ready runs
(:class:`LeaseShare`): each takes an equal part of the batch the first of them found —
as many parts as leases, or as the batch holds SHARE_MIN runs if fewer — so the batch
is leased by several statements side by side; a small batch goes whole to one."""

from __future__ import annotations

import pytest

from cronwheel.store import Store
from cronwheel.store.values import SHARE_MIN, LeaseShare

from .helpers import T0, at, create_jobs, fire, make_tenant, register_worker


async def ready(store: Store, count: int) -> None:
    tenant = await make_tenant(store)
    runs = await create_jobs(store, tenant.id, count)
    assert len(await fire(store, runs, now=T0)) == count


@pytest.mark.parametrize(
    ("ready_runs", "among", "taken"),
    [
        (4 * SHARE_MIN, 4, SHARE_MIN),  # a part each
        (3 * SHARE_MIN + 1, 3, SHARE_MIN + 1),  # rounded up: nothing is left over
        (2 * SHARE_MIN, 4, SHARE_MIN),  # fewer parts than leases: none under SHARE_MIN
        (2 * SHARE_MIN - 2, 2, 2 * SHARE_MIN - 2),  # parts would be small: all of it
        (4 * SHARE_MIN, 1, 4 * SHARE_MIN),  # one among one: all
    ],
)
async def test_a_lease_woken_with_others_takes_its_part_of_a_large_batch(
    store: Store, ready_runs: int, among: int, taken: int
) -> None:
    await ready(store, ready_runs)
    worker = await register_worker(store, now=at(1))
    admitted = await store.attempts_lease_admitted(
        worker=worker, max=4 * SHARE_MIN, now=at(1), share=LeaseShare(among=among)
    )
    assert len(admitted.attempts) == taken


async def test_the_batch_is_what_the_worker_can_take(store: Store) -> None:
    """A worker with few free slots takes them all: a part of its own budget would be
    small, whatever waits behind it."""
    await ready(store, 4 * SHARE_MIN)
    worker = await register_worker(store, now=at(1))
    admitted = await store.attempts_lease_admitted(
        worker=worker, max=SHARE_MIN, now=at(1), share=LeaseShare(among=4)
    )
    assert len(admitted.attempts) == SHARE_MIN


async def test_leases_sharing_a_batch_take_equal_parts_and_all_of_it_once(store: Store) -> None:
    """One after the other (as SQLite's writes always go), each takes a part of the
    batch the first found, not of what is left when it reads; one more finds nothing."""
    total = 3 * SHARE_MIN + 2
    await ready(store, total)
    workers = [await register_worker(store, now=at(1)) for _ in range(4)]
    share = LeaseShare(among=3)
    taken = []
    for worker in workers:
        admitted = await store.attempts_lease_admitted(
            worker=worker, max=4 * SHARE_MIN, now=at(1), share=share
        )
        taken.append([a.run_id for a in admitted.attempts])
    assert share.batch == total
    assert [len(t) for t in taken] == [SHARE_MIN + 1, SHARE_MIN + 1, SHARE_MIN, 0]
    every = [run_id for t in taken for run_id in t]
    assert len(set(every)) == len(every) == total
