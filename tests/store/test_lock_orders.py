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
from cronwheel.store import Store
from cronwheel.store.schema import runs

from .helpers import (
    ALL_SHARDS,
    NODE,
    at,
    collide,
    create_job,
    engine_of,
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
