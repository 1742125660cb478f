"""Workers leasing ready runs: routing, order, fencing tokens, and claimers racing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest

from cronwheel.domain.errors import NotFoundError, ValidationError
from cronwheel.domain.model import LeasedAttempt, Run, Worker
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import Store, create_store

from .helpers import (
    NODE,
    T0,
    at,
    create_job,
    create_jobs,
    dispatched_run,
    events_of,
    fire,
    hold_all_shards,
    make_tenant,
    register_worker,
)


def _ids(leased: Sequence[LeasedAttempt]) -> set[uuid.UUID]:
    return {a.run_id for a in leased}


async def test_lease_routes_by_pool_tenant_and_capabilities(store: Store) -> None:
    one, two = await make_tenant(store), await make_tenant(store)
    plain = await dispatched_run(store, one.id)
    gpu = await dispatched_run(store, one.id, requires=["gpu"])
    cuda = await dispatched_run(store, one.id, requires=["gpu", "cuda12"])
    batch = await dispatched_run(store, one.id, pool="batch")
    theirs = await dispatched_run(store, two.id, requires=["gpu"])

    async def lease(worker: Worker) -> set[uuid.UUID]:
        return _ids(await store.attempts_lease(worker=worker, max=10, now=at(1)))

    # A tenant's worker only sees its tenant's runs, whatever it can do.
    assert await lease(await register_worker(store, two.id, capabilities=["gpu", "cuda12"])) == {
        theirs.id
    }
    # Required capabilities must be a subset of the worker's.
    assert await lease(await register_worker(store, one.id, capabilities=["gpu", "ssd"])) == {
        plain.id,
        gpu.id,
    }
    assert await lease(await register_worker(store, one.id, capabilities=["cuda12"])) == set()
    # Pools separate; a shared worker (no tenant) serves every tenant of its pool.
    assert await lease(await register_worker(store, None, pool="batch")) == {batch.id}
    assert await lease(await register_worker(store, None, capabilities=["cuda12", "gpu"])) == {
        cuda.id
    }
    assert await lease(await register_worker(store, None, capabilities=["cuda12", "gpu"])) == set()


async def test_lease_starts_an_attempt(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(
        store, tenant.id, payload={"n": 1}, timeout=600, heartbeat_timeout=20
    )
    worker = await store.workers_register(
        tenant.id, pool="default", capabilities=["b", "a", "a"], tags=["x"], capacity=4, now=T0
    )
    assert (worker.tenant_id, worker.pool, worker.capacity, worker.registered_at) == (
        tenant.id,
        "default",
        4,
        T0,
    )
    assert sorted(worker.capabilities) == ["a", "b"]
    assert (await store.workers_get(worker.id)).id == worker.id
    with pytest.raises(NotFoundError):
        await store.workers_get(uuid.uuid4())
    with pytest.raises(ValidationError):
        await store.workers_register(None, pool="default", capabilities=[], tags=[], capacity=0)

    [leased] = await store.attempts_lease(worker=worker, max=5, now=at(2))
    assert (leased.run_id, leased.tenant_id, leased.job_id, leased.number) == (
        run.id,
        tenant.id,
        run.job_id,
        1,
    )
    assert (leased.task, leased.webhook, leased.payload) == ("demo.task", None, {"n": 1})
    assert leased.lease_expires_at == at(22)
    assert leased.deadline == at(602)
    assert leased.due_at == run.due_at
    assert leased.heartbeat_timeout == 20

    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt, after.started_at) == (RunState.RUNNING, 1, at(2))
    [attempt] = await store.attempts_list(tenant.id, run_id=run.id)
    assert attempt == await store.attempts_get(leased.attempt_id)
    assert (attempt.id, attempt.worker_id, attempt.state, attempt.number) == (
        leased.attempt_id,
        worker.id,
        AttemptState.RUNNING,
        1,
    )
    assert attempt.fencing_token == leased.fencing_token
    assert (attempt.started_at, attempt.lease_expires_at, attempt.deadline) == (
        at(2),
        at(22),
        at(602),
    )
    assert attempt.finished_at is None
    [*_, last] = await events_of(store, tenant.id, run_id=run.id)
    assert (last.from_state, last.to_state, last.attempt_id) == (
        "DISPATCHED",
        "RUNNING",
        leased.attempt_id,
    )


async def test_lease_order_max_and_fencing_tokens(store: Store) -> None:
    tenant = await make_tenant(store)
    runs: dict[str, Run] = {}
    for label, priority, due in (
        ("p3", 3, -30),
        ("p0-late", 0, -10),
        ("p0-early", 0, -20),
        ("p2", 2, -40),
        ("p1", 1, -5),
    ):
        runs[label] = (await create_job(store, tenant.id, due_at=at(due), priority=priority))[1]
    await fire(store, list(runs.values()), now=T0)
    label_of = {run.id: label for label, run in runs.items()}
    worker = await register_worker(store, tenant.id)

    batches: list[list[LeasedAttempt]] = []
    for size in (2, 2, 10, 10):
        leased = await store.attempts_lease(worker=worker, max=size, now=at(1))
        assert len(leased) <= size
        batches.append(leased)
    # Highest priority (P0) first, then the oldest due.
    assert [[label_of[a.run_id] for a in b] for b in batches] == [
        ["p0-early", "p0-late"],
        ["p1", "p2"],
        ["p3"],
        [],
    ]
    assert await store.attempts_lease(worker=worker, max=0, now=at(1)) == []
    tokens = [a.fencing_token for b in batches for a in b]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


async def _claim(store: Store, worker: Worker, size: int) -> list[LeasedAttempt]:
    """Lease until nothing is left for this worker."""
    got: list[LeasedAttempt] = []
    while True:
        batch = await store.attempts_lease(worker=worker, max=size, now=at(1))
        assert len(batch) <= size
        if not batch:
            return got
        got += batch


async def _race(
    store: Store, store_url: str, workers: Sequence[Worker], size: int
) -> list[list[LeasedAttempt]]:
    """Each worker claims through its own store (its own connections) at the same time."""
    claimers = [create_store(store_url) for _ in workers]
    for claimer in claimers:
        await claimer.open()
    try:
        return list(
            await asyncio.gather(
                *(_claim(c, w, size) for c, w in zip(claimers, workers, strict=True))
            )
        )
    finally:
        for claimer in claimers:
            await claimer.close()


async def _assert_split(
    store: Store, runs: Sequence[Run], claimed: Sequence[Sequence[LeasedAttempt]]
) -> None:
    """Every run went to exactly one claimer, with one attempt and its own token."""
    run_ids = [a.run_id for got in claimed for a in got]
    assert len(run_ids) == len(set(run_ids)), "a run was leased twice"
    assert set(run_ids) == {r.id for r in runs}
    tokens = [a.fencing_token for got in claimed for a in got]
    assert len(set(tokens)) == len(tokens)
    for run in runs:
        after = await store.runs_get(run.tenant_id, run.id)
        assert (after.state, after.attempt) == (RunState.RUNNING, 1)
        assert len(await store.attempts_list(run.tenant_id, run_id=run.id)) == 1


async def test_two_claimers_racing_for_the_same_runs(store: Store, store_url: str) -> None:
    tenant = await make_tenant(store)
    runs = await create_jobs(store, tenant.id, 30)
    await fire(store, runs)
    workers = [await register_worker(store, tenant.id), await register_worker(store, None)]
    claimed = await _race(store, store_url, workers, size=30)
    await _assert_split(store, runs, claimed)


async def test_many_claimers_racing_in_small_batches(store: Store, store_url: str) -> None:
    tenant = await make_tenant(store)
    runs = await create_jobs(store, tenant.id, 40)
    await fire(store, runs)
    workers = [await register_worker(store, tenant.id if i % 2 else None) for i in range(4)]
    claimed = await _race(store, store_url, workers, size=7)
    await _assert_split(store, runs, claimed)


async def test_a_run_dispatched_ahead_is_leased_from_its_instant(store: Store) -> None:
    """Dispatched ``lead`` seconds ahead of its instant, a run waits in the ready queue:
    not leasable before it, cancellable meanwhile, leasable from it on."""
    tenant = await make_tenant(store)
    _j, early = await create_job(store, tenant.id, due_at=at(2))
    _j, cancelled = await create_job(store, tenant.id, due_at=at(2))
    _j, later = await create_job(store, tenant.id, due_at=at(30))
    await hold_all_shards(store)
    fired = await store.runs_fire(
        run_ids=[early.id, cancelled.id, later.id], node_id=NODE, now=T0, lead=5
    )
    assert {f.id for f in fired} == {early.id, cancelled.id}  # 30 s away: not yet
    assert all(f.dispatched_at == T0 for f in fired)
    worker = await register_worker(store, tenant.id)
    assert await store.attempts_lease(worker=worker, max=10, now=at(1)) == []
    await store.runs_cancel(tenant.id, cancelled.id, now=at(1.5))
    leased = await store.attempts_lease(worker=worker, max=10, now=at(2))
    assert _ids(leased) == {early.id}
    assert (await store.runs_get(tenant.id, early.id)).started_at == at(2)
    assert (await store.runs_get(tenant.id, cancelled.id)).state is RunState.CANCELLED
