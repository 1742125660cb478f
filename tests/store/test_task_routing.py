"""Routing by task and by route tags: a worker that declared its tasks leases runs of
those tasks only (one that declared none, any); a run with route tags goes only to a
worker whose tags include them all — leasing now and leasing ahead alike — and the
routing check says why a run no live worker can take waits, naming the task or tags."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cronwheel.domain.model import LeasedAttempt, RouteCheck, Run, UnroutableRuns
from cronwheel.domain.states import RunState
from cronwheel.store import Store

from .helpers import (
    ALL_SHARDS,
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

WEBHOOK = {"url": "https://example.com/hook"}


def _ids(leased: Sequence[LeasedAttempt]) -> set[uuid.UUID]:
    return {a.run_id for a in leased}


async def _reason(store: Store, run: Run) -> str | None:
    return (await store.runs_get(run.tenant_id, run.id)).wait_reason


async def _check(store: Store, seconds: float) -> RouteCheck:
    return await store.runs_route_check(
        shards=ALL_SHARDS, min_wait=5.0, worker_ttl=30.0, now=at(seconds)
    )


# -- leasing -----------------------------------------------------------------------


async def test_a_worker_leases_only_the_tasks_it_declared(store: Store) -> None:
    tenant = await make_tenant(store)
    build = await dispatched_run(store, tenant.id, task="reports.build")
    ping = await dispatched_run(store, tenant.id, task="ops.ping")
    charge = await dispatched_run(store, tenant.id, task="billing.charge")
    hook = await dispatched_run(store, tenant.id, task=None, webhook=WEBHOOK)

    reports = await register_worker(store, tenant.id, tasks=["reports.build", "reports.build"])
    assert reports.tasks == ["reports.build"]  # stored sorted, without repeats
    assert (await store.workers_get(reports.id)).tasks == ["reports.build"]
    assert _ids(await store.attempts_lease(worker=reports, max=10, now=at(1))) == {build.id}

    # A worker that declared no tasks takes any task, as before tasks were declared;
    # the webhook run still needs the webhook capability.
    anything = await register_worker(store, tenant.id)
    assert anything.tasks is None
    assert _ids(await store.attempts_lease(worker=anything, max=10, now=at(1))) == {
        ping.id,
        charge.id,
    }

    # A webhook run has no task: the capability alone decides, whatever the tasks.
    both = await register_worker(store, tenant.id, capabilities=["webhook"], tasks=["x"])
    assert _ids(await store.attempts_lease(worker=both, max=10, now=at(1))) == {hook.id}


async def test_a_long_task_list_is_matched_exactly(store: Store) -> None:
    tenant = await make_tenant(store)
    wanted = await dispatched_run(store, tenant.id, task="t.0500")
    await dispatched_run(store, tenant.id, task="t.05")  # a prefix of names, not one
    await dispatched_run(store, tenant.id, task="T.0500")  # names are case-sensitive
    worker = await register_worker(store, tenant.id, tasks=[f"t.{i:04d}" for i in range(1000)])
    assert _ids(await store.attempts_lease(worker=worker, max=10, now=at(1))) == {wanted.id}


async def test_an_empty_task_list_takes_no_task_run(store: Store) -> None:
    tenant = await make_tenant(store)
    await dispatched_run(store, tenant.id)
    idle = await register_worker(store, tenant.id, tasks=[])
    assert idle.tasks == []
    assert await store.attempts_lease(worker=idle, max=10, now=at(1)) == []


async def test_route_tags_must_all_be_among_the_workers_tags(store: Store) -> None:
    tenant = await make_tenant(store)
    plain = await dispatched_run(store, tenant.id)
    red = await dispatched_run(store, tenant.id, route_tags=["red"])
    red_eu = await dispatched_run(store, tenant.id, route_tags=["red", "eu"])
    assert red.route_tags == ["red"]

    async def lease(tags: list[str]) -> set[uuid.UUID]:
        worker = await register_worker(store, tenant.id, tags=tags)
        return _ids(await store.attempts_lease(worker=worker, max=10, now=at(1)))

    assert await lease(["blue"]) == {plain.id}  # untagged runs go to anyone
    assert await lease(["blue", "red"]) == {red.id}
    assert await lease(["red"]) == set()  # red_eu needs eu as well
    assert await lease(["eu", "red", "blue"]) == {red_eu.id}


async def test_reservations_respect_tasks_and_route_tags(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, build = await create_job(store, tenant.id, due_at=at(3), task="reports.build")
    _job, other = await create_job(store, tenant.id, due_at=at(3), task="ops.ping")
    _job, red = await create_job(
        store, tenant.id, due_at=at(3), task="reports.build", route_tags=["red"]
    )
    await hold_all_shards(store)
    fired = await store.runs_fire(
        run_ids=[build.id, other.id, red.id], node_id=NODE, now=T0, lead=5
    )
    assert len(fired) == 3

    blue = await register_worker(store, tenant.id, tasks=["reports.build"], tags=["blue"])
    reserved = await store.attempts_lease(worker=blue, max=10, ahead=5, now=T0)
    assert _ids(reserved) == {build.id}
    assert all(a.not_before == at(3) for a in reserved)

    crimson = await register_worker(store, tenant.id, tasks=["reports.build"], tags=["red"])
    assert _ids(await store.attempts_lease(worker=crimson, max=10, ahead=5, now=T0)) == {red.id}
    assert (await store.runs_get(tenant.id, other.id)).state is RunState.DISPATCHED


async def test_a_full_batch_is_found_behind_runs_the_worker_cannot_take(store: Store) -> None:
    """The queue's head is all runs of another task (higher priority, older): the lease
    walks past them and still fills its batch with runs it can take."""
    tenant = await make_tenant(store)
    await create_jobs(store, tenant.id, 30, due_at=at(-10), task="other.task", priority=0)
    await create_jobs(store, tenant.id, 30, due_at=at(-10), priority=0, route_tags=["red"])
    mine = await create_jobs(store, tenant.id, 12, due_at=T0, task="mine", priority=3)
    every = await store.runs_due_scan(shards=ALL_SHARDS, until=at(1), limit=1000)
    await hold_all_shards(store)
    assert len(await store.runs_fire(run_ids=[d.id for d in every], node_id=NODE, now=T0)) == 72

    worker = await register_worker(store, tenant.id, tasks=["mine", "demo.task"])
    first = await store.attempts_lease(worker=worker, max=10, now=at(1))
    second = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert len(first) == 10 and len(second) == 2
    assert _ids(first) | _ids(second) == {r.id for r in mine}


async def test_a_recurring_jobs_next_runs_keep_its_route_tags(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(
        store, tenant.id, due_at=T0, schedule={"interval": 60}, route_tags=["red"]
    )
    assert job.template.route_tags == ["red"]
    assert run.route_tags == ["red"]
    await fire(store, [run], now=T0)
    page = await store.runs_list(tenant.id, limit=10)
    assert len(page.items) == 2
    assert [r.route_tags for r in page.items] == [["red"], ["red"]]


# -- the routing check ---------------------------------------------------------------


async def test_a_task_no_live_worker_handles_waits_with_its_name(store: Store) -> None:
    tenant = await make_tenant(store)
    ping = await dispatched_run(store, tenant.id, task="ops.ping")
    build = await dispatched_run(store, tenant.id, task="reports.build")
    await register_worker(store, tenant.id, tasks=["reports.build"], now=at(8))
    await register_worker(store, tenant.id, tasks=["billing.charge"], now=at(8))

    assert await _check(store, 10) == RouteCheck(waiting=1, marked=1, cleared=0)
    reason = "no live worker in pool 'default' handles task 'ops.ping'"
    assert await _reason(store, ping) == reason
    assert await _reason(store, build) is None
    [event] = [
        e for e in await events_of(store, tenant.id, run_id=ping.id) if e.kind == "run.waiting"
    ]
    assert (event.reason, event.data["task"]) == (reason, "ops.ping")
    assert await store.runs_unroutable(tenant.id) == [
        UnroutableRuns(tenant.id, "default", [], reason, 1, T0)
    ]

    # A worker handling it appears: the next check clears the reason.
    await register_worker(store, tenant.id, tasks=["ops.ping"], now=at(11))
    assert await _check(store, 12) == RouteCheck(waiting=0, marked=0, cleared=1)
    assert await _reason(store, ping) is None
    assert await store.runs_unroutable(None) == []


async def test_a_worker_without_tasks_handles_any(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, task="ops.ping")
    await register_worker(store, tenant.id, tasks=["reports.build"], now=at(8))
    await register_worker(store, tenant.id, now=at(8))
    assert await _check(store, 10) == RouteCheck(waiting=0, marked=0, cleared=0)
    assert await _reason(store, run) is None


async def test_route_tags_no_live_worker_carries_wait_with_them(store: Store) -> None:
    tenant = await make_tenant(store)
    red = await dispatched_run(store, tenant.id, route_tags=["red"])
    both = await dispatched_run(store, tenant.id, task="ops.ping", route_tags=["blue"])
    await register_worker(store, tenant.id, tags=["blue"], tasks=["demo.task"], now=at(8))
    await register_worker(store, tenant.id, tags=["green"], tasks=["ops.ping"], now=at(8))

    assert await _check(store, 10) == RouteCheck(waiting=2, marked=2, cleared=0)
    assert await _reason(store, red) == "no live worker in pool 'default' has tags ['red']"
    # Workers handle ops.ping and workers carry blue, but none does both.
    assert await _reason(store, both) == (
        "no live worker in pool 'default' handles task 'ops.ping' and has tags ['blue']"
    )
    alerts = await store.runs_unroutable(tenant.id)
    assert sorted((a.route_tags, a.runs) for a in alerts) == [(["blue"], 1), (["red"], 1)]

    await register_worker(store, tenant.id, tags=["red", "x"], now=at(11))
    assert await _check(store, 12) == RouteCheck(waiting=1, marked=0, cleared=1)
    assert await _reason(store, red) is None
    assert await _reason(store, both) is not None


async def test_capabilities_are_named_before_the_task(store: Store) -> None:
    """A run that requires what no worker has says so, as before tasks routed."""
    tenant = await make_tenant(store)
    run = await dispatched_run(store, tenant.id, pool="gpu", requires=["cuda"], task="t")
    await register_worker(store, tenant.id, pool="gpu", tasks=["u"], now=at(8))
    assert (await _check(store, 10)).marked == 1
    assert await _reason(store, run) == "no live worker in pool 'gpu' has capabilities ['cuda']"
    # With cuda now, but no worker runs the task: the task is named.
    await register_worker(
        store, tenant.id, pool="gpu", capabilities=["cuda"], tasks=["u"], now=at(11)
    )
    assert (await _check(store, 12)).marked == 1
    assert await _reason(store, run) == "no live worker in pool 'gpu' handles task 't'"
    # One worker runs it, another has cuda: their combination is what is missing.
    await register_worker(store, tenant.id, pool="gpu", tasks=["t"], now=at(13))
    assert (await _check(store, 14)).marked == 1
    assert await _reason(store, run) == (
        "no live worker in pool 'gpu' has capabilities ['cuda'] and handles task 't'"
    )
