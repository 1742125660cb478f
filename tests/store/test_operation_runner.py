"""The API's runner of bulk operations (``api/operations.py``) over the real store, both
backends, stepped by hand on a fixed clock: operations take turns, so one tenant's large
operation does not hold up another's; a failure tells clients what they may know."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from cronwheel.api.operations import OperationRunner
from cronwheel.clock import Clock
from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import Operation, OperationState, Selector
from cronwheel.domain.states import RunState
from cronwheel.store import Store
from cronwheel.store.schema import operations
from cronwheel.store.sql import bulk

from .helpers import at, create_job, create_jobs, engine_of, make_tenant

OPS = Actor("k-ops", role="operator")


class _Time:
    def __init__(self, start: datetime) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value


def runner(store: Store, time: _Time, owner: str = "api-1") -> OperationRunner:
    return OperationRunner(
        store, ttl=10, owner=owner, clock=Clock(time, offset=timedelta(0)), capacity=8
    )


async def cancel_tagged(store: Store, tenant_id: object, tag: str, second: float) -> Operation:
    return await store.operations_create(
        tenant_id,  # type: ignore[arg-type]
        action="cancel",
        selector=Selector(tags_all=(tag,)),
        actor=OPS,
        now=at(second),
    )


async def test_a_small_operation_ends_while_a_large_one_of_another_tenant_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "STEP", 2)
    big, small = await make_tenant(store), await make_tenant(store)
    large_runs = await create_jobs(store, big.id, 40, due_at=at(100), tags=["bad"])
    _job, their_run = await create_job(store, small.id, due_at=at(50), tags=["bad"])
    time = _Time(at(2))
    node = runner(store, time)
    large = await cancel_tagged(store, big.id, "bad", 1)
    assert await node.run_once()  # claims it, and its first step
    assert await node.run_once()
    # The second tenant's operation arrives while the first has 18 steps to go ...
    time.value = at(3)
    op = await cancel_tagged(store, small.id, "bad", 3)
    node.wake()
    steps = 0
    while (await store.operations_get(small.id, op.id)).state is not OperationState.DONE:
        assert await node.run_once()
        steps += 1
    # ... and ends after two of its own steps, one of the large one's between them.
    assert steps == 3
    still = await store.operations_get(big.id, large.id)
    assert (still.state, still.changed) == (OperationState.RUNNING, 6)
    assert (await store.runs_get(small.id, their_run.id)).state is RunState.CANCELLED
    while await node.run_once():
        pass
    done = await store.operations_get(big.id, large.id)
    assert (done.state, done.changed) == (OperationState.DONE, len(large_runs))


async def test_a_tenants_many_operations_share_one_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "STEP", 1)
    busy, quiet = await make_tenant(store), await make_tenant(store)
    for tenant in (busy, quiet):
        await create_jobs(store, tenant.id, 6, due_at=at(60), tags=["t"])
    node = runner(store, _Time(at(5)))
    mine = [await cancel_tagged(store, busy.id, "t", s) for s in (1, 2, 3)]
    theirs = await cancel_tagged(store, quiet.id, "t", 4)
    assert await node.claim() == 4
    stepped = []
    for _ in range(8):
        op = await node.step()
        assert op is not None and op.state is OperationState.RUNNING
        stepped.append(op.id)
    # Tenants alternate; the busy tenant's three take its turns in rotation, each one
    # begun before any goes on.
    assert stepped == [
        mine[0].id,
        theirs.id,
        mine[1].id,
        theirs.id,
        mine[2].id,
        theirs.id,
        mine[0].id,
        theirs.id,
    ]


async def test_leases_are_renewed_for_operations_waiting_their_turn(store: Store) -> None:
    tenant = await make_tenant(store)
    await create_job(store, tenant.id, due_at=at(60), tags=["x"])
    time = _Time(at(2))
    first = runner(store, time)
    await cancel_tagged(store, tenant.id, "x", 1)
    assert await first.claim() == 1
    # Past the claim's lease, but renewed: another node finds nothing to take.
    time.value = at(9)
    await first.renew()
    time.value = at(15)
    assert await runner(store, time, owner="api-2").claim() == 0
    # Not renewed any more: the other node takes it over, and the first lets it go.
    time.value = at(30)
    assert await runner(store, time, owner="api-2").claim() == 1
    await first.renew()
    assert len(first.turns) == 0


async def test_an_internal_error_is_logged_and_not_shown_to_clients(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = await make_tenant(store)
    op = await store.operations_create(
        tenant.id, action="pause", selector=Selector(all=True), actor=OPS, now=at(1)
    )
    # A row this version cannot read (say, written by a newer one): the step raises a
    # TypeError that names the code's internals.
    async with engine_of(store).begin() as conn:
        await conn.execute(
            operations.update()
            .where(operations.c.id == op.id)
            .values(selector={"all": True, "internal_secret_field": 1})
        )
    node = runner(store, _Time(at(2)))
    with caplog.at_level(logging.ERROR, logger="cronwheel.api"):
        assert await node.run_once()
    failed = await store.operations_get(tenant.id, op.id)
    assert failed.state is OperationState.FAILED
    assert failed.error is not None
    assert "internal_secret_field" not in failed.error and "TypeError" not in failed.error
    assert failed.error.startswith("stopped by an internal error")
    assert str(op.id) in failed.error
    # The details are in the log, with the operation's id.
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "operation_failed"]
    assert getattr(record, "operation", None) == str(op.id)
    assert record.exc_info is not None and "internal_secret_field" in str(record.exc_info[1])


async def test_a_refusal_is_shown_as_the_api_would_answer_it(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=2)
    made = await create_jobs(store, tenant.id, 2, due_at=at(600))
    op = await store.operations_create(
        tenant.id,
        action="trigger",
        selector=Selector(job_ids=tuple(run.job_id for run in made)),
        actor=OPS,
        now=at(1),
    )
    node = runner(store, _Time(at(2)))
    assert await node.run_once()
    failed = await store.operations_get(tenant.id, op.id)
    assert failed.state is OperationState.FAILED
    assert failed.error is not None and failed.error.startswith("limit_exceeded: ")
    assert "max_pending_runs" in failed.error
    async with engine_of(store).connect() as conn:
        owner = (
            await conn.execute(sa.select(operations.c.owner).where(operations.c.id == op.id))
        ).scalar()
    assert owner is None
