"""A worker's batch of results locks its runs in id order, as every path that changes
many runs at once does (a cancel or a pause, in bulk or of a job: ``_lock_live_runs``).
Taken in the batch's own order, a batch could hold one run while it waits for another
that such a path holds, itself waiting for the first: both stuck until PostgreSQL fails
one. On PostgreSQL only (SQLite runs one write transaction at a time)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from cronwheel.store import CompleteItem, FailItem, Store

from .helpers import at, create_jobs, engine_of, fire, make_tenant, register_worker, takes_in_order


@pytest.mark.parametrize("outcome", ["completed", "failed"])
async def test_a_batch_of_results_takes_its_runs_in_id_order(store: Store, outcome: str) -> None:
    engine = engine_of(store)
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")
    tenant = await make_tenant(store)
    # Many runs leased: the batch's attempts and runs are then found by key, in the
    # batch's order, rather than by reading small tables in the order they were written.
    await fire(store, await create_jobs(store, tenant.id, 2000, due_at=at(0)), now=at(0))
    worker = await register_worker(store, tenant.id, now=at(1))
    leased = []
    for _ in range(2):
        leased += await store.attempts_lease(worker=worker, max=1000, now=at(1))
    assert len(leased) == 2000
    await engine.dispose()  # no plan made for the small tables stays cached
    async with engine.begin() as conn:
        await conn.execute(sa.text("ANALYZE runs, attempts"))
    first, second = sorted(leased, key=lambda a: a.run_id)[1000:1002]
    # The batch names the later run first: its own order is not the lock order.
    if outcome == "completed":
        done = [CompleteItem(a.attempt_id, a.fencing_token, {"n": 1}) for a in (second, first)]
        report = store.attempts_complete_many(items=done, now=at(2))
    else:
        failed = [
            FailItem(a.attempt_id, a.fencing_token, "boom", retryable=False)
            for a in (second, first)
        ]
        report = store.attempts_fail_many(items=failed, now=at(2))

    # A cancel in bulk, half done, holds the first run and is about to take the second.
    outcomes = await takes_in_order(store, first.run_id, second.run_id, report)

    assert [o.ok for o in outcomes] == [True, True]
    expected = "SUCCESS" if outcome == "completed" else "FAILED"
    for a in (first, second):
        assert (await store.runs_get(tenant.id, a.run_id)).state.value == expected
