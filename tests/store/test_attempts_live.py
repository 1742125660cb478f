"""``attempts_get_live``: the fencing check of writes kept outside the database (worker
log lines) — the live attempt under its own token, and nothing else."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from cronwheel.domain.errors import NotFoundError, StaleFencingTokenError
from cronwheel.domain.states import AttemptState
from cronwheel.store import CompleteItem, HeartbeatItem, Store

from .helpers import at, fire, leased_run, make_tenant, register_worker


async def test_the_live_attempt_under_its_token(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)

    for scope in (None, tenant.id):
        live = await store.attempts_get_live(
            attempt_id=attempt.attempt_id, fencing_token=attempt.fencing_token, tenant_id=scope
        )
        assert (live.id, live.run_id, live.tenant_id) == (attempt.attempt_id, run.id, tenant.id)
        assert (live.number, live.state) == (1, AttemptState.RUNNING)

    with pytest.raises(StaleFencingTokenError) as stale:
        await store.attempts_get_live(
            attempt_id=attempt.attempt_id, fencing_token=attempt.fencing_token + 1
        )
    assert stale.value.field == "fencing_token"


async def test_unknown_and_other_tenants_attempts_are_not_found(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    _run, attempt = await leased_run(store, tenant.id)

    with pytest.raises(NotFoundError):
        await store.attempts_get_live(
            attempt_id=attempt.attempt_id, fencing_token=attempt.fencing_token, tenant_id=other.id
        )
    with pytest.raises(NotFoundError):
        await store.attempts_get_live(
            attempt_id=uuid.uuid4(), fencing_token=attempt.fencing_token, tenant_id=None
        )


async def test_an_ended_attempt_is_stale(store: Store) -> None:
    tenant = await make_tenant(store)
    _run, done = await leased_run(store, tenant.id)
    [ok] = await store.attempts_complete_many(
        items=[CompleteItem(done.attempt_id, done.fencing_token)], now=at(1)
    )
    assert ok.ok
    with pytest.raises(StaleFencingTokenError):
        await store.attempts_get_live(attempt_id=done.attempt_id, fencing_token=done.fencing_token)

    _run, released = await leased_run(store, tenant.id)
    [ok] = await store.attempts_release_many(
        items=[HeartbeatItem(released.attempt_id, released.fencing_token)], now=at(1)
    )
    assert ok.ok
    with pytest.raises(StaleFencingTokenError):
        await store.attempts_get_live(
            attempt_id=released.attempt_id, fencing_token=released.fencing_token
        )


async def test_a_lost_attempt_is_superseded_by_the_retry(store: Store) -> None:
    tenant = await make_tenant(store)
    retry = {"max_attempts": 2, "initial_delay": 0, "jitter": "none"}
    run, first = await leased_run(store, tenant.id, retry=retry, heartbeat_timeout=30)
    assert await store.attempts_expire(now=at(31)) == 1
    with pytest.raises(StaleFencingTokenError):
        await store.attempts_get_live(
            attempt_id=first.attempt_id, fencing_token=first.fencing_token
        )

    rescheduled = await store.runs_get(tenant.id, run.id)
    assert [f.id for f in await fire(store, [rescheduled], now=at(32))] == [run.id]
    worker = await register_worker(store, tenant.id, pool=run.pool)
    [second] = await store.attempts_lease(worker=worker, max=1, now=at(32))
    live = await store.attempts_get_live(
        attempt_id=second.attempt_id, fencing_token=second.fencing_token, tenant_id=tenant.id
    )
    assert live.number == 2
    # The zombie's token opens neither its own attempt nor the new one.
    for attempt_id in (first.attempt_id, second.attempt_id):
        with pytest.raises(StaleFencingTokenError):
            await store.attempts_get_live(attempt_id=attempt_id, fencing_token=first.fencing_token)


async def test_a_lease_that_ran_out_is_not_live_before_the_sweep(store: Store) -> None:
    """By the database clock the lease has ended, though nothing has marked it LOST."""
    tenant = await make_tenant(store)
    an_hour_ago = await store.db_now() - timedelta(hours=1)
    _run, attempt = await leased_run(store, tenant.id, now=an_hour_ago)
    with pytest.raises(StaleFencingTokenError):
        await store.attempts_get_live(
            attempt_id=attempt.attempt_id, fencing_token=attempt.fencing_token
        )
