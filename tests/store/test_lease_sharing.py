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


async def test_once_the_parts_of_all_there_was_are_handed_out_a_lease_alike_takes_none(
    store: Store,
) -> None:
    """The first read found every run (fewer than its budget): a third lease that can
    take the same runs gets no part — it would only find them locked — while a lease
    whose worker runs other tasks still takes its own runs."""
    tenant = await make_tenant(store)
    runs = await create_jobs(store, tenant.id, 2 * SHARE_MIN, task="a")
    runs += await create_jobs(store, tenant.id, SHARE_MIN, task="b")
    await fire(store, runs, now=T0)
    share = LeaseShare(among=4)
    a1, a2, a3 = [await register_worker(store, tasks=["a"], now=at(1)) for _ in range(3)]
    b = await register_worker(store, tasks=["b"], now=at(1))
    taken = []
    # a2 has room for 100 only: a3 still gets no part, and the 400 left wait for the
    # cohort's end (the wake of LeaseShare.ended).
    for worker, room in ((a1, 4 * SHARE_MIN), (b, 4 * SHARE_MIN), (a2, 100), (a3, 4 * SHARE_MIN)):
        share.joined()
        admitted = await store.attempts_lease_admitted(
            worker=worker, max=room, now=at(1), share=share
        )
        taken.append(len(admitted.attempts))
        woke = share.ended()
    assert share.whole and share.batch == 2 * SHARE_MIN
    assert taken == [SHARE_MIN, SHARE_MIN, 100, 0]
    # The last of the cohort to end: 600 of the batch's 1,000 taken (b's runs are not
    # the batch's), so the waiting leases read again.
    assert share.taken == SHARE_MIN + 100 and woke


def test_a_batch_too_small_to_split_is_the_first_lease_s_and_an_alike_one_takes_none() -> None:
    """Fewer than twice SHARE_MIN runs make one part: the first lease to read takes them
    all, and a lease that can take the same runs, deciding while the first still leases
    them, gets no part (leasing side by side, each would take what the other had not
    locked yet: the batch split at random). Another view still takes its own runs."""
    share = LeaseShare(among=3)
    assert share.part(SHARE_MIN + 20, budget=4 * SHARE_MIN, view="a") is None  # all of it
    assert share.part(SHARE_MIN + 20, budget=4 * SHARE_MIN, view="a") == 0
    assert share.part(SHARE_MIN, budget=4 * SHARE_MIN, view="b") is None
    # Not all there was (the first read stopped at its budget): the next takes its fill.
    more = LeaseShare(among=3)
    assert more.part(2 * SHARE_MIN, budget=SHARE_MIN, view="a") is None
    assert more.part(2 * SHARE_MIN, budget=SHARE_MIN, view="a") is None


async def test_when_the_first_read_found_more_than_it_could_take_every_lease_takes_a_part(
    store: Store,
) -> None:
    """1,500 ready runs, leases of 1,000: the first read cannot tell the batch is all
    there is (it is not), so the third lease still takes a part, of the runs past it."""
    await ready(store, 3 * SHARE_MIN)
    share = LeaseShare(among=3)
    taken = []
    for _ in range(3):
        worker = await register_worker(store, now=at(1))
        admitted = await store.attempts_lease_admitted(
            worker=worker, max=2 * SHARE_MIN, now=at(1), share=share
        )
        taken.append(len(admitted.attempts))
    assert not share.whole and share.batch == 2 * SHARE_MIN
    assert taken == [SHARE_MIN, SHARE_MIN, SHARE_MIN]


async def test_exactly_a_budget_of_ready_runs_is_all_there_is(store: Store) -> None:
    """A batch of exactly the budget is all there is (the read went one run past the
    budget and found none more)."""
    await ready(store, 2 * SHARE_MIN)
    share = LeaseShare(among=3)
    worker = await register_worker(store, now=at(1))
    admitted = await store.attempts_lease_admitted(
        worker=worker, max=2 * SHARE_MIN, now=at(1), share=share
    )
    assert len(admitted.attempts) == SHARE_MIN
    assert share.whole and share.batch == 2 * SHARE_MIN


def test_only_the_last_lease_of_a_cohort_to_end_wakes_and_only_when_runs_may_be_left() -> None:
    def cohort(*, ready: int, budget: int) -> LeaseShare:
        share = LeaseShare(among=2)
        share.joined()
        share.joined()
        assert share.part(ready, budget=budget, view="v") == SHARE_MIN
        return share

    share = cohort(ready=2 * SHARE_MIN, budget=2 * SHARE_MIN)  # all there was
    share.took(SHARE_MIN, view="v")
    assert not share.ended()  # the other lease is still leasing
    share.took(SHARE_MIN, view="v")
    assert not share.ended()  # the batch is taken: nothing to read again

    share = cohort(ready=2 * SHARE_MIN, budget=2 * SHARE_MIN)
    share.took(SHARE_MIN, view="v")
    assert not share.ended()
    assert share.ended()  # the other took nothing (its part is left)

    share = cohort(ready=2 * SHARE_MIN + 1, budget=2 * SHARE_MIN)  # more than the batch
    share.took(SHARE_MIN, view="v")
    share.took(SHARE_MIN, view="v")
    assert not share.ended()
    assert share.ended()  # the batch is taken, but runs past it wait

    share = cohort(ready=2 * SHARE_MIN, budget=2 * SHARE_MIN)
    share.took(SHARE_MIN, view="w")  # a lease of another view: not the batch's runs
    assert not share.ended()
    assert share.ended()

    share = cohort(ready=2 * SHARE_MIN + 1, budget=2 * SHARE_MIN)
    assert not share.ended()
    # Admission held every run back: the cohort took nothing, and does not wake itself
    # into another round that would take nothing too.
    assert not share.ended()


async def test_the_run_read_past_the_budget_changes_no_decision(store: Store) -> None:
    """A tenant that may run as many runs as the lease's budget, with more waiting: a
    lease of a cohort is granted them all and not reported held, as a lone lease is
    (the extra run only tells the cohort there was more)."""
    tenant = await make_tenant(store, max_concurrent_runs=SHARE_MIN)
    runs = await create_jobs(store, tenant.id, 2 * SHARE_MIN)
    await fire(store, runs, now=T0)
    share = LeaseShare(among=2)
    worker = await register_worker(store, now=at(1))
    admitted = await store.attempts_lease_admitted(
        worker=worker, max=SHARE_MIN, now=at(1), share=share
    )
    assert len(admitted.attempts) == SHARE_MIN
    assert admitted.held == {}
    assert not share.whole
