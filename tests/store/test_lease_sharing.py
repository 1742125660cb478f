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


async def test_the_batch_is_what_the_first_lease_to_read_could_take(store: Store) -> None:
    """A worker with few free slots reading first makes the batch small: it takes all it
    can, and so does the next, whatever waits behind them (parts never split what no
    lease of the cohort could have taken)."""
    await ready(store, 4 * SHARE_MIN)
    share = LeaseShare(among=2)
    small, large = await register_worker(store, now=at(1)), await register_worker(store, now=at(1))
    first = await store.attempts_lease_admitted(worker=small, max=SHARE_MIN, now=at(1), share=share)
    second = await store.attempts_lease_admitted(
        worker=large, max=4 * SHARE_MIN, now=at(1), share=share
    )
    assert share.batch == SHARE_MIN
    assert (len(first.attempts), len(second.attempts)) == (SHARE_MIN, 3 * SHARE_MIN)


async def test_the_slots_kept_for_p0_come_on_top_of_a_part(store: Store) -> None:
    """A pool keeping half of a worker's slots for P0: a part of lower-class runs is
    still a whole part, not a part less those slots."""
    await ready(store, 2 * SHARE_MIN)  # P2 runs
    worker = await register_worker(store, now=at(1))  # 100 slots: 50 kept for P0
    admitted = await store.attempts_lease_admitted(
        worker=worker, max=4 * SHARE_MIN, now=at(1), p0_share=0.5, share=LeaseShare(among=2)
    )
    assert admitted.p0_reserved == 50
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
