"""Paths that lock the same rows meet on PostgreSQL (SQLite runs one write transaction
at a time: nothing can overlap). Each pair is made to meet in the order that would
close a cycle if one of them took its locks out of the documented order
(``SqlCore._lock_live_runs``: runs in id order, plain runs and nodes before workflow
runs, then their jobs); PostgreSQL would then fail one with "deadlock detected", a 503
at the API. Each must instead wait for the other and go on."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import Selector
from cronwheel.domain.states import RunState
from cronwheel.store import CompleteItem, Store
from cronwheel.store.schema import runs

from .helpers import (
    ALL_SHARDS,
    NODE,
    at,
    collide,
    create_job,
    create_jobs,
    engine_of,
    fire,
    make_tenant,
    no_failures,
    register_worker,
)


@pytest.fixture(autouse=True)
def _postgres_only(store: Store) -> None:
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")


async def test_starting_reservations_takes_the_runs_in_id_order(store: Store) -> None:
    """Reservations are started by token, drawn in the lease's order (highest class,
    soonest first); a bulk cancel locks the same runs in id order."""
    tenant = await make_tenant(store)
    # The older run (smaller id) is due later: its reservation gets the later token.
    _j1, older = await create_job(store, tenant.id, due_at=at(30), now=at(0))
    _j2, newer = await create_job(store, tenant.id, due_at=at(10), now=at(0))
    assert older.id < newer.id
    await store.shard_leases_acquire(node_id=NODE, shards=ALL_SHARDS, ttl=3600, now=at(0))
    fired = await store.runs_fire(run_ids=[older.id, newer.id], node_id=NODE, now=at(0), lead=60)
    assert len(fired) == 2
    worker = await register_worker(store, tenant.id, now=at(0))
    reserved = await store.attempts_lease(worker=worker, max=2, ahead=60, now=at(0))
    assert sorted(a.run_id for a in reserved) == [older.id, newer.id]
    assert all(a.not_before is not None for a in reserved)
    op = await store.operations_create(
        tenant.id,
        action="cancel",
        selector=Selector(run_ids=(older.id, newer.id)),
        actor=Actor("k-ops", role="operator"),
        now=at(1),
    )
    await store.operations_claim(owner="api-1", ttl=30, now=at(1))

    outcomes = await collide(
        store,
        # The older run held a moment: the bulk cancel waits for it holding nothing; the
        # start would take the newer run first, then wait too.
        sa.select(runs.c.id).where(runs.c.id == older.id).with_for_update(),
        store.operations_step(op.id, owner="api-1", ttl=30, now=at(2)),
        store.attempts_start_many(
            worker_id=worker.id, tokens=[a.fencing_token for a in reserved], now=at(30)
        ),
        what=("the bulk cancel waiting for the older run", "the start behind it"),
    )

    no_failures(outcomes, ("bulk cancel", "start"))
    states = {r: (await store.runs_get(tenant.id, r)).state for r in (older.id, newer.id)}
    assert states == {older.id: RunState.CANCELLED, newer.id: RunState.CANCELLED}


async def test_the_expiry_sweep_takes_the_run_before_its_attempt(store: Store) -> None:
    """A worker's batch of results locks its runs in id order, then their attempts; the
    sweep ending an attempt whose lease ran out must not hold the attempt while waiting
    for its run (a late result for it)."""
    tenant = await make_tenant(store)
    made = await create_jobs(store, tenant.id, 2, due_at=at(0))
    await fire(store, made, now=at(0))
    worker = await register_worker(store, tenant.id, now=at(0))
    leased = await store.attempts_lease(worker=worker, max=2, now=at(0))
    low, high = sorted(leased, key=lambda a: a.run_id)

    outcomes = await collide(
        store,
        # The later run held a moment: the batch holds the first and waits.
        sa.select(runs.c.id).where(runs.c.id == high.run_id).with_for_update(),
        store.attempts_complete_many(
            items=[CompleteItem(a.attempt_id, a.fencing_token, {"ok": 1}) for a in (low, high)],
            now=at(20),
        ),
        # The sweep, once the lease ran out: the batch holds the first attempt's run.
        store.attempts_expire(attempt_ids=[low.attempt_id], now=at(600)),
        what=("the batch holding the first run", "the sweep"),
    )

    no_failures(outcomes, ("results", "expiry sweep"))
    assert outcomes[1] == 0  # passed over, not waited for
    for a in (low, high):
        assert (await store.runs_get(tenant.id, a.run_id)).state is RunState.SUCCESS
