"""Cancelling runs of workflows while their nodes end, on PostgreSQL (SQLite runs one
write transaction at a time: nothing can overlap). A worker's batch of results locks
its runs in id order, then the workflow runs it advances; a cancel must take them in
that order too, or the two wait for each other until PostgreSQL breaks the deadlock by
failing one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from cronwheel.domain.bulk import OperationState
from cronwheel.store import Store
from cronwheel.store.schema import runs

from .helpers import (
    at,
    claimed_bulk_cancel,
    create_job,
    engine_of,
    fire,
    make_tenant,
    register_worker,
    takes_in_order,
)
from .test_workflows import create, nodes_of

CHAIN = [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["b"]}]


@pytest.fixture(autouse=True)
def _postgres_only(store: Store) -> None:
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")


async def _asked_to_stop(store: Store, tenant_id: object) -> set[object]:
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(
            sa.select(runs.c.id).where(
                runs.c.tenant_id == tenant_id, runs.c.cancel_requested.is_(sa.true())
            )
        )
        return set(rows.scalars())


async def test_a_cancel_takes_the_nodes_before_the_workflow_run(store: Store) -> None:
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, CHAIN)
    await fire(store, [wf], now=at(0))
    worker = await register_worker(store, tenant.id, now=at(1))
    [leased] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert (await nodes_of(store, tenant.id, wf))["a"].state.value == "RUNNING"

    # A node's end, half done, holds its run and is about to take its workflow run.
    await takes_in_order(
        store, leased.run_id, wf.id, store.runs_cancel(tenant.id, wf.id, now=at(2))
    )

    assert await _asked_to_stop(store, tenant.id) == {wf.id, leased.run_id}
    nodes = await nodes_of(store, tenant.id, wf)
    assert [nodes[n].state.value for n in "abc"] == ["RUNNING", "CANCELLED", "CANCELLED"]


async def test_a_bulk_cancel_takes_plain_runs_and_nodes_in_one_id_order(store: Store) -> None:
    """A worker's batch of results holding a plain run and a node of a workflow run
    locks them in id order; a bulk cancel naming both must take them in that order too,
    the workflow runs only after them."""
    tenant = await make_tenant(store)
    _job, plain = await create_job(store, tenant.id, due_at=at(0), now=at(-60))
    wf = await create(store, tenant.id, CHAIN)  # its nodes are made later: larger ids
    await fire(store, [plain, wf], now=at(0))
    worker = await register_worker(store, tenant.id, now=at(1))
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1))
    node = (await nodes_of(store, tenant.id, wf))["a"]
    assert sorted(a.run_id for a in leased) == [plain.id, node.id]  # in id order
    op_id = await claimed_bulk_cancel(store, tenant.id, [plain.id, node.id], now=at(2))

    # The batch of results, half done, holds the plain run and is about to take the node.
    done = await takes_in_order(
        store, plain.id, node.id, store.operations_step(op_id, owner="api-1", ttl=30, now=at(2))
    )
    while done.state is not OperationState.DONE:
        done = await store.operations_step(op_id, owner="api-1", ttl=30, now=at(2))

    assert await _asked_to_stop(store, tenant.id) >= {plain.id, node.id}
