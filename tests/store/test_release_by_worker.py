"""A worker deregistering: every attempt it still holds is handed back at once, the try
not counted — and nothing of any other worker or tenant is touched."""

from __future__ import annotations

import uuid

from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import CompleteItem, Store

from .helpers import (
    at,
    dispatched_run,
    events_of,
    leased_run,
    make_tenant,
    register_worker,
    transitions_of,
)


async def test_releases_every_running_attempt_of_the_worker(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run_a, attempt_a = await leased_run(store, tenant.id, worker=worker)
    run_b, attempt_b = await leased_run(store, tenant.id, worker=worker)
    run_done, attempt_done = await leased_run(store, tenant.id, worker=worker)
    [ok] = await store.attempts_complete_many(
        items=[CompleteItem(attempt_done.attempt_id, attempt_done.fencing_token)], now=at(1)
    )
    assert ok.ok
    # Another worker of the same tenant keeps its run.
    other, other_attempt = await leased_run(store, tenant.id)

    released = await store.attempts_release_by_worker(
        worker_id=worker.id, tenant_id=tenant.id, now=at(2)
    )

    assert sorted(o.attempt_id for o in released) == sorted(
        [attempt_a.attempt_id, attempt_b.attempt_id]
    )
    assert all(o.ok and o.run_state is RunState.DISPATCHED for o in released)
    for run, attempt in ((run_a, attempt_a), (run_b, attempt_b)):
        after = await store.runs_get(tenant.id, run.id)
        assert (after.state, after.attempt, after.finished_at) == (RunState.DISPATCHED, 0, None)
        stored = await store.attempts_get(attempt.attempt_id)
        assert (stored.state, stored.finished_at) == (AttemptState.RELEASED, at(2))
        [event] = [e for e in await events_of(store, tenant.id, run_id=run.id) if e.at == at(2)]
        assert (event.from_state, event.to_state) == ("RUNNING", "DISPATCHED")
        assert event.reason == "released: worker deregistered"
        assert event.attempt_id == attempt.attempt_id
    assert (await store.runs_get(tenant.id, run_done.id)).state is RunState.SUCCESS
    assert (await store.attempts_get(attempt_done.attempt_id)).state is AttemptState.SUCCEEDED
    assert (await store.runs_get(tenant.id, other.id)).state is RunState.RUNNING
    assert (await store.attempts_get(other_attempt.attempt_id)).state is AttemptState.RUNNING

    # Nothing is left to release: a second call is a no-op.
    assert await store.attempts_release_by_worker(worker_id=worker.id, now=at(3)) == []


async def test_released_runs_are_leased_again_without_using_an_attempt(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run, first = await leased_run(store, tenant.id, worker=worker)
    assert first.number == 1
    [gone] = await store.attempts_release_by_worker(worker_id=worker.id, now=at(1))
    assert gone.attempt_id == first.attempt_id

    successor = await register_worker(store, tenant.id)
    [second] = await store.attempts_lease(worker=successor, max=1, now=at(2))
    assert second.run_id == run.id
    assert second.number == 1
    assert second.fencing_token > first.fencing_token
    # The old token is dead: it completes nothing.
    [stale] = await store.attempts_complete_many(
        items=[CompleteItem(first.attempt_id, first.fencing_token)], now=at(3)
    )
    assert (stale.ok, stale.error_code) == (False, "stale_fencing_token")
    [ok] = await store.attempts_complete_many(
        items=[CompleteItem(second.attempt_id, second.fencing_token, "done")], now=at(3)
    )
    assert ok.ok
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt, after.result) == (RunState.SUCCESS, 1, "done")
    assert await transitions_of(store, tenant.id, run.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]


async def test_another_tenant_releases_nothing(store: Store) -> None:
    owner = await make_tenant(store)
    stranger = await make_tenant(store)
    worker = await register_worker(store, owner.id)
    run, attempt = await leased_run(store, owner.id, worker=worker)
    before = await store.runs_get(owner.id, run.id)
    events_before = await events_of(store, owner.id, run_id=run.id)

    assert (
        await store.attempts_release_by_worker(
            worker_id=worker.id, tenant_id=stranger.id, now=at(1)
        )
        == []
    )
    assert await store.runs_get(owner.id, run.id) == before
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING
    assert await events_of(store, owner.id, run_id=run.id) == events_before

    # Its own tenant's scope reaches it.
    [released] = await store.attempts_release_by_worker(
        worker_id=worker.id, tenant_id=owner.id, now=at(2)
    )
    assert released.attempt_id == attempt.attempt_id


async def test_a_worker_serving_every_tenant_releases_across_tenants(store: Store) -> None:
    a = await make_tenant(store)
    b = await make_tenant(store)
    run_a = await dispatched_run(store, a.id)
    run_b = await dispatched_run(store, b.id)
    shared = await register_worker(store, None)
    leased = await store.attempts_lease(worker=shared, max=10, now=at(1))
    assert {x.run_id for x in leased} == {run_a.id, run_b.id}

    # Scoped to one tenant, only that tenant's attempt goes back.
    [only_a] = await store.attempts_release_by_worker(
        worker_id=shared.id, tenant_id=a.id, now=at(2)
    )
    assert only_a.attempt_id == next(x.attempt_id for x in leased if x.run_id == run_a.id)
    assert (await store.runs_get(b.id, run_b.id)).state is RunState.RUNNING
    [rest] = await store.attempts_release_by_worker(worker_id=shared.id, now=at(3))
    assert rest.attempt_id == next(x.attempt_id for x in leased if x.run_id == run_b.id)
    assert (await store.runs_get(a.id, run_a.id)).state is RunState.DISPATCHED
    assert (await store.runs_get(b.id, run_b.id)).state is RunState.DISPATCHED


async def test_an_unknown_worker_releases_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)
    assert await store.attempts_release_by_worker(worker_id=uuid.uuid4(), now=at(1)) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.RUNNING
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING
