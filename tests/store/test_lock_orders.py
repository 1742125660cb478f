"""Paths that lock the same rows meet on PostgreSQL (SQLite runs one write transaction
at a time: nothing can overlap). Each pair is made to meet in the order that would
close a cycle if one of them took its locks out of the documented order
(``SqlCore._lock_live_runs``: runs in id order, plain runs and nodes before workflow
runs, then their jobs); PostgreSQL would then fail one with "deadlock detected", a 503
at the API. Each must instead wait for the other and go on."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from cronwheel.domain import workflow
from cronwheel.domain.errors import IllegalTransitionError
from cronwheel.domain.model import LeasedAttempt, Run
from cronwheel.domain.states import RETRY, JobState, RunState
from cronwheel.store import CompleteItem, FailItem, HeartbeatItem, Store
from cronwheel.store.schema import jobs, runs, tenants

from .helpers import (
    ALL_SHARDS,
    NODE,
    at,
    claimed_bulk_cancel,
    collide,
    create_job,
    create_jobs,
    engine_of,
    fire,
    make_tenant,
    no_failures,
    register_worker,
    until_lock_wait,
)
from .test_workflows import create, nodes_of


@pytest.fixture(autouse=True)
def _postgres_only(store: Store) -> None:
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")


def _held(table: sa.Table, row_id: Any) -> sa.Select[Any]:
    """The row locked as a change to it locks it (FOR UPDATE)."""
    return sa.select(table.c.id).where(table.c.id == row_id).with_for_update()


def _key_shared(table: sa.Table, row_id: Any) -> sa.Select[Any]:
    """The row locked as a new row's key to it locks it (FOR KEY SHARE)."""
    return (
        sa.select(table.c.id).where(table.c.id == row_id).with_for_update(read=True, key_share=True)
    )


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
    op_id = await claimed_bulk_cancel(store, tenant.id, [older.id, newer.id], now=at(1))

    outcomes = await collide(
        store,
        # The older run held a moment: the bulk cancel waits for it holding nothing; the
        # start would take the newer run first, then wait too.
        _held(runs, older.id),
        store.operations_step(op_id, owner="api-1", ttl=30, now=at(2)),
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
        _held(runs, high.run_id),
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


CANCEL_PREVIOUS = {"cron": "* * * * *", "timezone": "UTC", "overlap": "cancel_previous"}


async def _asked_to_stop(store: Store, run_id: Any) -> bool:
    async with engine_of(store).connect() as conn:
        query = sa.select(runs.c.cancel_requested).where(runs.c.id == run_id)
        return bool((await conn.execute(query)).scalar_one())


async def _overlapping(store: Store) -> tuple[Any, Any, Any, Any]:
    """A cancel_previous job whose first run is still running when the second is due:
    the tenant, the job, the first run and the second."""
    tenant = await make_tenant(store)
    job, first = await create_job(store, tenant.id, due_at=at(60), schedule=CANCEL_PREVIOUS)
    await fire(store, [first], now=at(60))
    worker = await register_worker(store, tenant.id, now=at(61))
    [leased] = await store.attempts_lease(worker=worker, max=1, now=at(61))
    assert leased.run_id == first.id
    [second] = [
        r
        for r in (await store.runs_list(tenant.id, limit=10)).items
        if r.state is RunState.SCHEDULED
    ]
    assert first.id < second.id
    return tenant, job, first, second


async def test_firing_with_cancel_previous_takes_the_older_run_first(store: Store) -> None:
    """Firing holds its candidate, the newer run, then cancels the older one; a cancel
    of the job takes the older first. Firing must not wait for the older run."""
    tenant, job, first, second = await _overlapping(store)

    outcomes = await collide(
        store,
        # The job held a moment (a trigger, an override): firing the second run holds
        # it and waits here, to make the next occurrence.
        _held(jobs, job.id),
        fire(store, [second], now=at(120)),
        store.jobs_cancel(tenant.id, job.id, now=at(121)),
        what=("firing holding the second run", "the cancel of the job"),
    )

    no_failures(outcomes, ("firing", "job cancel"))
    assert (await store.jobs_get(tenant.id, job.id)).state is JobState.CANCELLED
    assert await _asked_to_stop(store, first.id)


async def test_a_previous_run_held_elsewhere_leaves_its_successor_for_the_next_poll(
    store: Store,
) -> None:
    tenant, _job, first, second = await _overlapping(store)
    async with engine_of(store).connect() as other:
        await other.begin()
        await other.execute(_held(runs, first.id))
        assert await fire(store, [second], now=at(120)) == []  # not waited for
        await other.rollback()
    assert (await store.runs_get(tenant.id, second.id)).state is RunState.SCHEDULED
    assert not await _asked_to_stop(store, first.id)

    fired = await fire(store, [second], now=at(121))
    assert [f.id for f in fired] == [second.id]
    assert await _asked_to_stop(store, first.id)


async def _one_failed_one_running(store: Store, tenant_id: Any) -> tuple[Run, Run]:
    """A workflow run of two independent nodes: a failed, b still running (so the
    workflow run is RUNNING). Returns the workflow run and a."""
    wf = await create(store, tenant_id, [{"name": "a"}, {"name": "b"}])
    await fire(store, [wf], now=at(0))
    worker = await register_worker(store, tenant_id, now=at(1))
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1))
    nodes = await nodes_of(store, tenant_id, wf)
    [attempt_a] = [x for x in leased if x.run_id == nodes["a"].id]
    await store.attempts_fail_many(
        items=[FailItem(attempt_a.attempt_id, attempt_a.fencing_token, "boom", retryable=False)],
        now=at(2),
    )
    nodes = await nodes_of(store, tenant_id, wf)
    assert (nodes["a"].state, nodes["b"].state) == (RunState.FAILED, RunState.RUNNING)
    return wf, nodes["a"]


async def test_retrying_a_node_takes_its_workflow_run_before_the_job(store: Store) -> None:
    """A pause of the job takes its live runs, the workflow run among them, then the
    job; a retry of a failed node must take the workflow run before the job too."""
    tenant = await make_tenant(store)
    wf, a = await _one_failed_one_running(store, tenant.id)

    outcomes = await collide(
        store,
        # A share of the job (a scheduler making a run of it): the pause, holding the
        # workflow run, waits for it; the retry's own lock of the job does not.
        _key_shared(jobs, wf.job_id),
        store.jobs_pause(tenant.id, wf.job_id, now=at(3)),
        store.runs_redrive(tenant.id, a.id, move=RETRY, now=at(3)),
        what=("the pause holding the workflow run", "the retry"),
    )

    no_failures(outcomes, ("job pause", "node retry"))
    assert (await store.jobs_get(tenant.id, wf.job_id)).state is JobState.PAUSED
    assert (await nodes_of(store, tenant.id, wf))["a"].state is RunState.SCHEDULED


async def test_retrying_a_node_while_its_tenant_is_deleted(store: Store) -> None:
    """A retry takes the tenant (as every path adding runs), then the node and its
    workflow run; a deletion of the tenant takes its live runs, then the tenant."""
    tenant = await make_tenant(store)
    _wf, a = await _one_failed_one_running(store, tenant.id)

    outcomes = await collide(
        store,
        # A share of the tenant (a job being created in it): the deletion waits for it.
        _key_shared(tenants, tenant.id),
        store.tenants_delete(tenant.id, force=True, now=at(3)),
        store.runs_redrive(tenant.id, a.id, move=RETRY, now=at(3)),
        what=("the deletion waiting for the tenant", "the retry"),
    )

    no_failures(outcomes, ("tenant deletion", "node retry"))
    assert (await store.tenants_list()).items == []  # deleted, after the retry


async def _root_leased(
    store: Store, tenant_id: Any, nodes: list[dict[str, Any]]
) -> tuple[Run, Any, LeasedAttempt]:
    """A workflow run of ``nodes`` fired, its one root leased: the workflow run, the
    worker and the root's attempt."""
    wf = await create(store, tenant_id, nodes)
    await fire(store, [wf], now=at(0))
    worker = await register_worker(store, tenant_id, now=at(1))
    [root] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    return wf, worker, root


def _done(attempt: LeasedAttempt, result: dict[str, Any]) -> list[CompleteItem]:
    return [CompleteItem(attempt.attempt_id, attempt.fencing_token, result)]


async def test_advancing_a_workflow_run_and_cancelling_its_waiting_node(store: Store) -> None:
    """A node's end advances its workflow run: the workflow run locked, then the nodes
    it makes ready. A cancel of a waiting node must take the workflow run before it."""
    tenant = await make_tenant(store)
    wf, _worker, a = await _root_leased(
        store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}]
    )
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert b.state is RunState.PENDING

    outcomes = await collide(
        store,
        # The workflow run held a moment (another node ending): both queue on it.
        _held(runs, wf.id),
        store.attempts_complete_many(items=_done(a, {"x": 1}), now=at(2)),
        store.runs_cancel(tenant.id, b.id, now=at(2)),
        what=("a's result waiting for the workflow run", "b's cancel"),
    )

    no_failures(outcomes, ("a's result", "b's cancel"))
    nodes = await nodes_of(store, tenant.id, wf)
    assert (nodes["a"].state, nodes["b"].state) == (RunState.SUCCESS, RunState.CANCELLED)


async def test_a_cancel_of_a_workflow_waits_for_a_node_ending_before_its_waiting_nodes(
    store: Store,
) -> None:
    """A worker's result for node b holds b, then the workflow run, then makes c ready.
    A cancel of the workflow must not take c, still waiting, before b: here c's run has
    the smaller id."""
    tenant = await make_tenant(store)
    wf, worker, a = await _root_leased(
        store,
        tenant.id,
        [{"name": "a"}, {"name": "c", "after": ["b"]}, {"name": "b", "after": ["a"]}],
    )
    await store.attempts_complete_many(items=_done(a, {"x": 1}), now=at(2))
    [b] = await store.attempts_lease(worker=worker, max=10, now=at(3))
    nodes = await nodes_of(store, tenant.id, wf)
    assert nodes["c"].id < b.run_id and nodes["c"].state is RunState.PENDING

    outcomes = await collide(
        store,
        # The workflow run held a moment: b's result holds b and waits for it.
        _held(runs, wf.id),
        store.attempts_complete_many(items=_done(b, {"y": 2}), now=at(4)),
        store.jobs_cancel(tenant.id, wf.job_id, now=at(4)),
        what=("b's result waiting for the workflow run", "the cancel of the workflow"),
    )

    no_failures(outcomes, ("b's result", "job cancel"))
    assert (await store.jobs_get(tenant.id, wf.job_id)).state is JobState.CANCELLED
    nodes = await nodes_of(store, tenant.id, wf)
    assert (nodes["b"].state, nodes["c"].state) == (RunState.SUCCESS, RunState.CANCELLED)


async def test_a_waiting_node_held_elsewhere_is_asked_for_again_in_one_subtransaction(
    store: Store,
) -> None:
    """A waiting node held by another transaction: a cancel of its workflow gives back
    its locks and takes them again, over and over, then waits. However many tries, it
    holds one subtransaction (past 64, every session's visibility checks slow down)."""
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}])
    await fire(store, [wf], now=at(0))
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert b.state is RunState.PENDING
    held = sa.text(
        "SELECT count(*) FILTER (WHERE l.locktype = 'transactionid' AND l.granted) "
        "FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
        "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' GROUP BY a.pid"
    )
    engine = engine_of(store)
    async with engine.connect() as holder, engine.connect() as watcher:
        await holder.begin()
        await holder.execute(_held(runs, b.id))
        cancel = asyncio.create_task(store.jobs_cancel(tenant.id, wf.job_id, now=at(1)))
        await until_lock_wait(watcher, cancel, "the cancel waiting, its tries spent")
        xids = (await watcher.execute(held)).scalars().all()
        await watcher.rollback()
        await holder.commit()
        await asyncio.wait_for(cancel, 10)
    assert (await store.jobs_get(tenant.id, wf.job_id)).state is JobState.CANCELLED
    assert xids and max(xids) <= 3, f"transaction ids held by the cancel: {xids}"


async def test_retrying_a_node_and_a_node_below_it_at_once(store: Store) -> None:
    """Retrying a node sends the nodes it had cancelled or skipped below it back to
    waiting, holding their workflow run; a retry of one of those takes it too. Each
    must take the workflow run before the node."""
    tenant = await make_tenant(store)
    wf, _worker, a = await _root_leased(
        store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"], "trigger_rule": "all_done"}]
    )
    b = (await nodes_of(store, tenant.id, wf))["b"]
    await store.runs_cancel(tenant.id, b.id, now=at(2))  # b may run after a fails
    failed = FailItem(a.attempt_id, a.fencing_token, "boom", retryable=False)
    await store.attempts_fail_many(items=[failed], now=at(3))
    nodes = await nodes_of(store, tenant.id, wf)
    assert (nodes["a"].state, nodes["b"].state) == (RunState.FAILED, RunState.CANCELLED)

    outcomes = await collide(
        store,
        # The workflow run held a moment: both retries wait for it.
        _held(runs, wf.id),
        store.runs_redrive(tenant.id, a.run_id, move=RETRY, now=at(4)),
        store.runs_redrive(tenant.id, b.id, move=RETRY, now=at(4)),
        what=("a's retry waiting for the workflow run", "b's retry"),
    )

    # a's retry goes first and sends b back to waiting: b's own retry then finds it
    # waiting, and is refused as for any run not failed or cancelled. Not a deadlock.
    assert not isinstance(outcomes[0], BaseException), outcomes[0]
    assert isinstance(outcomes[1], IllegalTransitionError), outcomes[1]
    nodes = await nodes_of(store, tenant.id, wf)
    assert (nodes["a"].state, nodes["b"].state) == (RunState.SCHEDULED, RunState.PENDING)


@pytest.mark.parametrize("hand_back", ["release", "lapse"])
async def test_a_gate_opening_and_its_reservations_end_take_the_workflow_run_first(
    store: Store, hand_back: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's end opens the gates of the nodes after it on its workflow run's row;
    taking a gated reservation off (a hand-back, a lapse) locks the workflow run before
    the node, so the two are never interleaved: whichever goes first, the node ends up
    ready for any worker, never PENDING with a gate no one holds."""
    monkeypatch.setattr(workflow, "GATE_LAYER_MIN", 1)  # b alone is held ahead
    tenant = await make_tenant(store)
    wf, worker, a = await _root_leased(
        store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}]
    )
    got = await store.attempts_lease_admitted(worker=worker, max=1, gated=1, now=at(1.5))
    [b] = got.attempts
    assert b.gated
    if hand_back == "release":
        end = store.attempts_release_many(
            items=[HeartbeatItem(b.attempt_id, b.fencing_token)], now=at(2)
        )
    else:  # past the reservation's end: the expiry sweep voids it
        end = store.attempts_expire(now=b.lease_expires_at + timedelta(seconds=1))

    outcomes = await collide(
        store,
        _held(runs, wf.id),
        store.attempts_complete_many(items=_done(a, {"x": 1}), now=at(2)),
        end,
        what=("a's result waiting for the workflow run", f"b's {hand_back}"),
    )

    no_failures(outcomes, ("a's result", f"b's {hand_back}"))
    node = (await nodes_of(store, tenant.id, wf))["b"]
    if node.state is RunState.PENDING:  # the sweep passed over the held workflow run
        assert hand_back == "lapse"
        assert await store.attempts_expire(now=b.lease_expires_at + timedelta(seconds=2)) == 1
        node = (await nodes_of(store, tenant.id, wf))["b"]
    assert node.state is RunState.DISPATCHED
    assert node.payload == {"upstream": {"a": {"x": 1}}}
    other = await register_worker(store, tenant.id, now=at(40))
    [again] = await store.attempts_lease(worker=other, max=1, now=at(40))
    assert again.run_id == node.id
