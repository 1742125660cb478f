"""Runs no live worker can take: the routing check records why they wait (one event per
run), clears the reason when a worker that can take them appears, and leasing clears it
too; liveness, tenant scope, shards and grouping."""

from __future__ import annotations

import uuid
from datetime import datetime

from cronwheel.domain.model import RouteCheck, Run, UnroutableRuns, Worker
from cronwheel.domain.states import RunState
from cronwheel.store import Store

from .helpers import (
    ALL_SHARDS,
    T0,
    at,
    create_job,
    dispatched_run,
    events_of,
    make_tenant,
    register_worker,
)

CUDA = "no live worker in pool 'gpu' has capabilities ['cuda']"


async def _check(
    store: Store, when: datetime, *, shards: list[int] = ALL_SHARDS, ttl: float = 30.0
) -> RouteCheck:
    return await store.runs_route_check(shards=shards, min_wait=5.0, worker_ttl=ttl, now=when)


async def _reason(store: Store, run: Run) -> str | None:
    return (await store.runs_get(run.tenant_id, run.id)).wait_reason


async def _waiting_events(store: Store, run: Run) -> list[str | None]:
    events = await events_of(store, run.tenant_id, run_id=run.id)
    return [e.reason for e in events if e.kind == "run.waiting"]


async def _worker(
    store: Store,
    tenant_id: uuid.UUID | None,
    *,
    pool: str,
    capabilities: list[str],
    now: datetime,
) -> Worker:
    return await store.workers_register(
        tenant_id, pool=pool, capabilities=capabilities, tags=[], capacity=1, now=now
    )


async def test_reason_recorded_once_and_cleared_when_a_capable_worker_appears(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="gpu", requires=["cuda"])
    await register_worker(store, tenant.id, pool="gpu", capabilities=["ssd"])

    # Not yet: the run has waited less than min_wait.
    assert await _check(store, at(3)) == RouteCheck(waiting=0, marked=0, cleared=0)
    assert await _reason(store, run) is None

    assert await _check(store, at(10)) == RouteCheck(waiting=1, marked=1, cleared=0)
    assert await _reason(store, run) == CUDA
    assert await _waiting_events(store, run) == [CUDA]
    # Later checks find nothing new: no second event, no write.
    assert await _check(store, at(12)) == RouteCheck(waiting=1, marked=0, cleared=0)
    assert await _waiting_events(store, run) == [CUDA]

    expected = UnroutableRuns(
        tenant_id=tenant.id, pool="gpu", requires=["cuda"], reason=CUDA, runs=1, since=T0
    )
    assert await store.runs_unroutable(tenant.id) == [expected]
    assert await store.runs_unroutable(None) == [expected]
    assert await store.runs_unroutable((await make_tenant(store)).id) == []

    await _worker(store, tenant.id, pool="gpu", capabilities=["cuda", "ssd"], now=at(13))
    assert await _check(store, at(14)) == RouteCheck(waiting=0, marked=0, cleared=1)
    assert await _reason(store, run) is None
    assert await store.runs_unroutable(None) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.DISPATCHED


async def test_only_live_workers_serving_the_tenant_count(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="p")
    reason = "no live worker in pool 'p'"

    # Another tenant's worker never serves this tenant's runs.
    await _worker(store, other.id, pool="p", capabilities=[], now=at(8))
    # A shared worker last seen at T0 is not live 100 s later (ttl 30).
    await _worker(store, None, pool="p", capabilities=[], now=T0)
    # A worker that deregistered is not live, however recently seen.
    gone = await _worker(store, tenant.id, pool="p", capabilities=[], now=at(95))
    await store.workers_deregister(gone.id, now=at(96))
    assert (await store.workers_get(gone.id)).deregistered_at == at(96)
    # Another pool does not help.
    await _worker(store, tenant.id, pool="q", capabilities=[], now=at(99))

    assert (await _check(store, at(100))).marked == 1
    assert await _reason(store, run) == reason

    # A shared worker seen recently serves every tenant of its pool.
    await _worker(store, None, pool="p", capabilities=["x"], now=at(101))
    assert (await _check(store, at(102))).cleared == 1
    assert await _reason(store, run) is None


async def test_a_worker_holding_a_live_lease_is_live_without_leasing(store: Store) -> None:
    tenant = await make_tenant(store)
    busy_run = await dispatched_run(store, tenant.id, pool="p", heartbeat_timeout=600)
    busy = await register_worker(store, tenant.id, pool="p")
    [leased] = await store.attempts_lease(worker=busy, max=1, now=T0)
    assert leased.run_id == busy_run.id
    waiting = await dispatched_run(store, tenant.id, pool="p")

    # Last seen at T0, long past the ttl, but its lease runs until T0 + 600 s.
    assert (await _check(store, at(100))).marked == 0
    assert await _reason(store, waiting) is None
    # Its lease expired (even before the attempt is marked lost): no longer live.
    assert (await _check(store, at(700))).marked == 1
    assert await _reason(store, waiting) == "no live worker in pool 'p'"


async def test_a_lease_call_counts_as_seen(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await _worker(store, tenant.id, pool="p", capabilities=[], now=T0)
    assert await store.attempts_lease(worker=worker, max=1, now=at(40)) == []
    assert (await store.workers_get(worker.id)).last_seen_at == at(40)
    run = await dispatched_run(store, tenant.id, now=at(41), pool="p")

    assert (await _check(store, at(60))).marked == 0  # seen 20 s ago
    assert (await _check(store, at(80))).marked == 1  # seen 40 s ago: ttl 30
    assert await _reason(store, run) == "no live worker in pool 'p'"


async def test_leasing_clears_the_reason(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="gpu", requires=["cuda"])
    assert (await _check(store, at(10))).marked == 1
    worker = await _worker(store, tenant.id, pool="gpu", capabilities=["cuda"], now=at(11))
    [leased] = await store.attempts_lease(worker=worker, max=1, now=at(11))
    assert leased.run_id == run.id
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.wait_reason) == (RunState.RUNNING, None)
    assert await store.runs_unroutable(None) == []


async def test_a_run_that_stops_waiting_otherwise_loses_its_reason(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="gpu", requires=["cuda"])
    assert (await _check(store, at(10))).marked == 1
    await store.runs_cancel(tenant.id, run.id, now=at(11))
    # Not an alert any more at once (only waiting DISPATCHED runs are)...
    assert await store.runs_unroutable(None) == []
    # ...and the next check clears what the cancel left.
    assert (await _check(store, at(12))).cleared == 1
    assert await _reason(store, run) is None


async def test_only_the_given_shards_are_checked(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="gpu", requires=["cuda"])
    others = [s for s in ALL_SHARDS if s != run.shard]
    assert await _check(store, at(10), shards=others) == RouteCheck(0, 0, 0)
    assert await _check(store, at(10), shards=[]) == RouteCheck(0, 0, 0)
    assert await _reason(store, run) is None
    assert (await _check(store, at(10), shards=[run.shard])).marked == 1


async def test_runs_are_marked_by_group(store: Store) -> None:
    tenant = await make_tenant(store)
    gpu = [
        await dispatched_run(store, tenant.id, now=at(i), pool="gpu", requires=["cuda"])
        for i in range(3)
    ]
    both = await dispatched_run(store, tenant.id, now=at(1), pool="gpu", requires=["cuda", "fp8"])
    young = await dispatched_run(store, tenant.id, now=at(9), pool="gpu", requires=["cuda"])

    assert await _check(store, at(10)) == RouteCheck(waiting=4, marked=4, cleared=0)
    assert [await _reason(store, r) for r in gpu] == [CUDA] * 3
    assert await _reason(store, young) is None  # waited 1 s only
    both_reason = "no live worker in pool 'gpu' has capabilities ['cuda', 'fp8']"
    assert await _reason(store, both) == both_reason
    assert await store.runs_unroutable(tenant.id) == [
        UnroutableRuns(tenant.id, "gpu", ["cuda"], CUDA, 3, T0),
        UnroutableRuns(tenant.id, "gpu", ["cuda", "fp8"], both_reason, 1, at(1)),
    ]

    # The young run joins its group once it has waited long enough; the others keep
    # their one event each.
    assert await _check(store, at(20)) == RouteCheck(waiting=5, marked=1, cleared=0)
    assert await _reason(store, young) == CUDA
    assert [len(await _waiting_events(store, r)) for r in [*gpu, both, young]] == [1] * 5

    # A worker with cuda but not fp8 clears one group only.
    await _worker(store, tenant.id, pool="gpu", capabilities=["cuda"], now=at(21))
    assert await _check(store, at(22)) == RouteCheck(waiting=1, marked=0, cleared=4)
    assert await _reason(store, both) == both_reason


async def test_scheduled_runs_are_not_checked(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, pool="gpu", requires=["cuda"])
    assert await _check(store, at(100)) == RouteCheck(0, 0, 0)
    assert await _reason(store, run) is None


async def test_a_worker_that_only_calls_webhooks_cannot_take_task_runs(store: Store) -> None:
    """The built-in webhook worker of a pool takes its webhook runs, not its task runs:
    a task run with only such a worker alive waits with a reason."""
    tenant = await make_tenant(store)
    task_run = await dispatched_run(store, tenant.id)
    hook_run = await dispatched_run(
        store, tenant.id, task=None, webhook={"url": "https://example.com/hook"}
    )
    assert hook_run.requires == ["webhook"]
    hooks = await store.workers_register(
        tenant.id,
        pool="default",
        capabilities=["webhook"],
        tags=[],
        capacity=1,
        webhooks_only=True,
        now=at(1),
    )
    assert hooks.webhooks_only
    assert await _check(store, at(10)) == RouteCheck(waiting=1, marked=1, cleared=0)
    assert await _reason(store, task_run) == "no live worker in pool 'default'"
    assert await _reason(store, hook_run) is None
    # A worker with task handlers (and no special capability) takes the task run.
    await _worker(store, tenant.id, pool="default", capabilities=[], now=at(11))
    assert await _check(store, at(12)) == RouteCheck(waiting=0, marked=0, cleared=1)
    assert await _reason(store, task_run) is None
