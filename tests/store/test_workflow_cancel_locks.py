"""Cancelling a workflow run while one of its nodes ends, on PostgreSQL (SQLite runs one
write transaction at a time: nothing can overlap). A node's end locks its node's run,
then its workflow run to advance it; a cancel must take them in that order too, or the
two wait for each other until PostgreSQL breaks the deadlock by failing one."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import OperationState, Selector
from cronwheel.store import Store
from cronwheel.store.schema import runs
from cronwheel.testing import wait_until_async

from .helpers import at, create_job, engine_of, fire, make_tenant, register_worker
from .test_workflows import create, nodes_of

CHAIN = [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["b"]}]


async def _blocked(watcher: AsyncConnection) -> bool:
    """Whether a session of this database waits on a row lock (read in a transaction of
    its own: activity is read once per transaction)."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    try:
        return int((await watcher.execute(query)).scalar_one()) > 0
    finally:
        await watcher.rollback()


async def test_a_cancel_takes_the_nodes_before_the_workflow_run(store: Store) -> None:
    engine = engine_of(store)
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, CHAIN)
    await fire(store, [wf], now=at(0))
    worker = await register_worker(store, tenant.id, now=at(1))
    [leased] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert (await nodes_of(store, tenant.id, wf))["a"].state.value == "RUNNING"

    async with engine.connect() as ending, engine.connect() as watcher:
        # A node's end, half done: its run is locked, its workflow run not yet.
        await ending.begin()
        await ending.execute(
            runs.update().where(runs.c.id == leased.run_id).values(reason=runs.c.reason)
        )
        cancel = asyncio.create_task(store.runs_cancel(tenant.id, wf.id, now=at(2)))

        async def waiting() -> bool:
            assert not cancel.done(), "the cancel went ahead past a locked node"
            return await _blocked(watcher)

        await wait_until_async(waiting, 10, what="the cancel waiting on the node's lock")
        # The end goes on to lock the workflow run: free, since the cancel waits on the
        # node first (the other order would hold it here, and this would fail).
        locked = await ending.execute(
            sa.select(runs.c.id).where(runs.c.id == wf.id).with_for_update(nowait=True)
        )
        assert locked.scalar_one() == wf.id
        await ending.commit()
        await asyncio.wait_for(cancel, timeout=10)
        asked = await watcher.execute(
            sa.select(runs.c.id).where(
                runs.c.tenant_id == tenant.id, runs.c.cancel_requested.is_(sa.true())
            )
        )
        assert set(asked.scalars()) == {wf.id, leased.run_id}  # asked to stop, running

    nodes = await nodes_of(store, tenant.id, wf)
    assert [nodes[n].state.value for n in "abc"] == ["RUNNING", "CANCELLED", "CANCELLED"]


async def test_a_bulk_cancel_takes_plain_runs_and_nodes_in_one_id_order(store: Store) -> None:
    """A worker's batch of results holding a plain run and a node of a workflow run
    locks them in id order; a bulk cancel naming both must take them in that order too,
    the workflow runs only after them."""
    engine = engine_of(store)
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")
    tenant = await make_tenant(store)
    _job, plain = await create_job(store, tenant.id, due_at=at(0), now=at(-60))
    wf = await create(store, tenant.id, CHAIN)  # its nodes are made later: larger ids
    await fire(store, [plain, wf], now=at(0))
    worker = await register_worker(store, tenant.id, now=at(1))
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1))
    node = (await nodes_of(store, tenant.id, wf))["a"]
    assert sorted(a.run_id for a in leased) == [plain.id, node.id]  # in id order
    op = await store.operations_create(
        tenant.id,
        action="cancel",
        selector=Selector(run_ids=(plain.id, node.id)),
        actor=Actor("k-ops", role="operator"),
        now=at(2),
    )
    await store.operations_claim(owner="api-1", ttl=30, now=at(2))

    async with engine.connect() as batch, engine.connect() as watcher:
        # The batch of results, half done: it took the plain run, the first in id order.
        await batch.begin()
        await batch.execute(sa.select(runs.c.id).where(runs.c.id == plain.id).with_for_update())
        step = asyncio.create_task(store.operations_step(op.id, owner="api-1", ttl=30, now=at(2)))

        async def waiting() -> bool:
            assert not step.done(), "the cancel went ahead past a locked run"
            return await _blocked(watcher)

        await wait_until_async(waiting, 10, what="the cancel waiting on the plain run")
        # The batch goes on to the node: free, since the cancel waits on the plain run
        # before it takes any other (taking the node first, this would fail).
        locked = await batch.execute(
            sa.select(runs.c.id).where(runs.c.id == node.id).with_for_update(nowait=True)
        )
        assert locked.scalar_one() == node.id
        await batch.commit()
        done = await asyncio.wait_for(step, timeout=10)
        while done.state is not OperationState.DONE:
            done = await store.operations_step(op.id, owner="api-1", ttl=30, now=at(2))
        asked = await watcher.execute(
            sa.select(runs.c.id).where(
                runs.c.tenant_id == tenant.id, runs.c.cancel_requested.is_(sa.true())
            )
        )
        assert set(asked.scalars()) >= {plain.id, node.id}
