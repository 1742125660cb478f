"""Reservations: runs dispatched ahead of their instant, leased ahead by a worker, and
started by it at the instant — unless a cancel or pause came first."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa

from cronwheel.domain.model import LeasedAttempt, ReservationsStarted, Run, Worker
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import Store
from cronwheel.store.schema import runs
from cronwheel.store.values import CompleteItem, HeartbeatItem

from .helpers import (
    T0,
    at,
    create_job,
    engine_of,
    fire,
    hold_all_shards,
    make_tenant,
    register_worker,
    transitions_of,
)

DUE = at(3)  # the runs' instant; they are dispatched at T0, three seconds ahead


async def _ahead_run(store: Store, tenant_id: uuid.UUID, **fields: object) -> Run:
    """A run due at ``DUE``, dispatched at T0 with a five-second lead."""
    _job, run = await create_job(store, tenant_id, due_at=DUE, now=T0, **fields)
    await hold_all_shards(store)
    fired = await store.runs_fire(run_ids=[run.id], node_id="node-a", now=T0, lead=5)
    assert [f.id for f in fired] == [run.id]
    return await store.runs_get(tenant_id, run.id)


async def _reserve(store: Store, worker: Worker) -> LeasedAttempt:
    [reserved] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(0))
    return reserved


def _ref(a: LeasedAttempt) -> HeartbeatItem:
    return HeartbeatItem(a.attempt_id, a.fencing_token)


async def test_a_reservation_starts_at_its_instant_and_not_before(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id, timeout=600, heartbeat_timeout=20)
    worker, other = await register_worker(store, tenant.id), await register_worker(store, tenant.id)

    # Without ``ahead`` a run due later is not leasable at all.
    assert await store.attempts_lease(worker=worker, max=10, now=at(0)) == []
    reserved = await _reserve(store, worker)
    assert (reserved.run_id, reserved.number, reserved.not_before) == (run.id, 1, DUE)
    assert reserved.lease_expires_at == at(23)  # the instant plus the heartbeat timeout
    # Reserved: still DISPATCHED, no attempt, not started, and no one else's.
    got = await store.runs_get(tenant.id, run.id)
    assert (got.state, got.attempt, got.started_at) == (RunState.DISPATCHED, 0, None)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []
    assert await store.attempts_lease(worker=other, max=10, ahead=5, now=at(1)) == []

    token = reserved.fencing_token
    # Too early: not yet, nothing changes.
    early = await store.attempts_start_many(worker_id=worker.id, tokens=[token], now=at(2.9))
    assert early == ReservationsStarted(started_at=None, not_yet=[token])
    assert (await store.runs_get(tenant.id, run.id)).state == RunState.DISPATCHED
    # Another worker cannot start it; an unknown token is refused beside it.
    theirs = await store.attempts_start_many(
        worker_id=other.id, tokens=[token, token + 1000], now=at(3)
    )
    assert theirs == ReservationsStarted(started_at=None, refused=[token, token + 1000])

    started = await store.attempts_start_many(worker_id=worker.id, tokens=[token], now=at(3.5))
    assert started == ReservationsStarted(
        started_at=at(3.5), started=[token], first_tries=[(DUE, at(3.5), tenant.id, 2)]
    )
    got = await store.runs_get(tenant.id, run.id)
    assert (got.state, got.attempt, got.started_at) == (RunState.RUNNING, 1, at(3.5))
    [attempt] = await store.attempts_list(tenant.id, run_id=run.id)
    assert (attempt.id, attempt.fencing_token, attempt.state, attempt.worker_id) == (
        reserved.attempt_id,
        reserved.fencing_token,
        AttemptState.RUNNING,
        worker.id,
    )
    # The lease and deadline run from the start, not from the instant.
    assert (attempt.started_at, attempt.lease_expires_at, attempt.deadline) == (
        at(3.5),
        at(23.5),
        at(603.5),
    )
    # Started once: a repeat is refused and changes nothing.
    again = await store.attempts_start_many(worker_id=worker.id, tokens=[token], now=at(4))
    assert again.refused == [token]
    assert len(await store.attempts_list(tenant.id, run_id=run.id)) == 1
    # The attempt is an ordinary one from here on.
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(reserved.attempt_id, reserved.fencing_token, {"ok": 1})], now=at(5)
    )
    assert done.ok and done.run_state == RunState.SUCCESS
    assert await transitions_of(store, tenant.id, run.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]


async def test_a_reservation_started_ahead_begins_at_its_instant(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id, timeout=600, heartbeat_timeout=20)
    worker = await register_worker(store, tenant.id)
    reserved = await _reserve(store, worker)
    token = reserved.fencing_token

    # Further ahead than allowed: not yet, nothing changes.
    early = await store.attempts_start_many(
        worker_id=worker.id, tokens=[token], now=at(1.9), ahead=1.0
    )
    assert early == ReservationsStarted(started_at=None, not_yet=[token])
    assert (await store.runs_get(tenant.id, run.id)).state == RunState.DISPATCHED

    started = await store.attempts_start_many(
        worker_id=worker.id, tokens=[token], now=at(2.25), ahead=1.0
    )
    assert started == ReservationsStarted(
        started_at=DUE, started=[token], first_tries=[(DUE, DUE, tenant.id, 2)]
    )
    # RUNNING from the start, dated from its instant: the run, its attempt (lease and
    # deadline) and the transition.
    got = await store.runs_get(tenant.id, run.id)
    assert (got.state, got.attempt, got.started_at) == (RunState.RUNNING, 1, DUE)
    [attempt] = await store.attempts_list(tenant.id, run_id=run.id)
    assert (attempt.started_at, attempt.lease_expires_at, attempt.deadline) == (
        DUE,
        at(23),
        at(603),
    )
    # A cancel now is a cancel of a running run: requested (the worker learns of it by
    # its heartbeat), not refused at a start.
    await store.runs_cancel(tenant.id, run.id, now=at(2.5))
    assert (await store.runs_get(tenant.id, run.id)).state == RunState.RUNNING
    [beat] = await store.attempts_heartbeat_many(items=[_ref(reserved)], now=at(2.6))
    assert beat.ok and beat.cancel_requested


async def test_a_cancel_before_the_start_wins(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id)
    worker = await register_worker(store, tenant.id)
    reserved = await _reserve(store, worker)

    await store.runs_cancel(tenant.id, run.id, now=at(2))
    refused = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3)
    )
    assert refused.refused == [reserved.fencing_token]
    got = await store.runs_get(tenant.id, run.id)
    assert (got.state, got.attempt, got.started_at) == (RunState.CANCELLED, 0, None)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []


async def test_a_pause_before_the_start_wins_and_resume_dispatches_afresh(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id)
    worker = await register_worker(store, tenant.id)
    reserved = await _reserve(store, worker)

    await store.jobs_pause(tenant.id, run.job_id, now=at(1))
    refused = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3)
    )
    assert refused.refused == [reserved.fencing_token]
    assert (await store.runs_get(tenant.id, run.id)).state == RunState.SCHEDULED

    # Resumed and fired again, the run is free for anyone: the old reservation is void.
    await store.jobs_resume(tenant.id, run.job_id, now=at(2))
    fired = await store.runs_fire(run_ids=[run.id], node_id="node-a", now=at(2), lead=5)
    assert [f.id for f in fired] == [run.id]
    stale = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3)
    )
    assert stale.refused == [reserved.fencing_token]
    other = await register_worker(store, tenant.id)
    [fresh] = await store.attempts_lease(worker=other, max=10, ahead=5, now=at(2))
    assert fresh.run_id == run.id and fresh.fencing_token > reserved.fencing_token


async def test_a_lapsed_reservation_is_taken_by_another_worker(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id, heartbeat_timeout=10)
    worker, other = await register_worker(store, tenant.id), await register_worker(store, tenant.id)
    reserved = await _reserve(store, worker)

    # Held until the instant plus the heartbeat timeout ...
    assert await store.attempts_expire(now=at(13)) == 0
    assert await store.attempts_lease(worker=other, max=10, now=at(13)) == []
    # ... then voided by the expiry sweep, and anyone's: leased now, it starts at once
    # under a new token.
    assert await store.attempts_expire(now=at(13.5)) == 1
    [taken] = await store.attempts_lease(worker=other, max=10, now=at(13.5))
    assert taken.not_before is None and taken.fencing_token > reserved.fencing_token
    late = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(14)
    )
    assert late.refused == [reserved.fencing_token]
    [attempt] = await store.attempts_list(tenant.id, run_id=run.id)
    assert attempt.worker_id == other.id


async def test_a_reservation_handed_back_is_free_at_once(store: Store) -> None:
    tenant = await make_tenant(store)
    run = await _ahead_run(store, tenant.id)
    worker, other = await register_worker(store, tenant.id), await register_worker(store, tenant.id)
    reserved = await _reserve(store, worker)

    [released] = await store.attempts_release_many(items=[_ref(reserved)], now=at(1))
    assert released.ok
    [again] = await store.attempts_lease(worker=other, max=10, ahead=5, now=at(1))
    assert again.run_id == run.id and again.not_before == DUE
    # A worker deregistering hands back the reservations it holds.
    [gone] = await store.attempts_release_by_worker(worker_id=other.id, now=at(2))
    assert gone.attempt_id == again.attempt_id
    got = await store.runs_get(tenant.id, run.id)
    assert (got.state, got.attempt) == (RunState.DISPATCHED, 0)
    [third] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(2))
    assert third.run_id == run.id


async def test_a_lease_ahead_starts_what_is_due_and_reserves_the_rest(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, now_run = await create_job(store, tenant.id, due_at=T0, now=T0)
    later = await _ahead_run(store, tenant.id)
    assert [f.id for f in await fire(store, [now_run])] == [now_run.id]
    worker = await register_worker(store, tenant.id)

    leased = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(0))
    assert [(a.run_id, a.not_before) for a in leased] == [(now_run.id, None), (later.id, DUE)]
    assert (await store.runs_get(tenant.id, now_run.id)).state == RunState.RUNNING
    assert (await store.runs_get(tenant.id, later.id)).state == RunState.DISPATCHED
    # Another tenant's key reaches none of it.
    stranger = await make_tenant(store)
    refused = await store.attempts_start_many(
        worker_id=worker.id, tokens=[leased[1].fencing_token], tenant_id=stranger.id, now=at(3)
    )
    assert refused.refused == [leased[1].fencing_token]


async def test_reserve_takes_runs_not_due_beyond_max_once_max_is_filled(store: Store) -> None:
    tenant = await make_tenant(store)
    due_now = []
    for _ in range(3):
        _job, run = await create_job(store, tenant.id, due_at=T0, now=T0)
        due_now.append(run)
    ahead = [await _ahead_run(store, tenant.id) for _ in range(3)]
    assert len(await fire(store, due_now)) == 3
    worker = await register_worker(store, tenant.id)
    now_ids = {r.id for r in due_now}

    # ``max`` filled with runs due now only: ``reserve`` adds nothing (the worker comes
    # back for more as soon as its slots free up).
    first = await store.attempts_lease(worker=worker, max=2, ahead=5, reserve=10, now=at(0))
    assert [a.not_before for a in first] == [None, None]
    assert {a.run_id for a in first} <= now_ids
    # ``max`` reaching runs not due yet: ``reserve`` takes more of them, reserved.
    leased = await store.attempts_lease(worker=worker, max=2, ahead=5, reserve=10, now=at(0))
    [(left, none)] = [(a.run_id, a.not_before) for a in leased if a.not_before is None]
    assert (left, none) == ((now_ids - {a.run_id for a in first}).pop(), None)
    assert sorted(a.run_id for a in leased if a.not_before is not None) == sorted(
        r.id for r in ahead
    )
    assert {a.not_before for a in leased if a.not_before is not None} == {DUE}
    for run in ahead:
        assert (await store.runs_get(tenant.id, run.id)).state == RunState.DISPATCHED
    assert await store.attempts_lease(worker=worker, max=5, ahead=5, reserve=10, now=at(0)) == []


async def test_reserve_waits_for_max_to_fill_and_is_bounded(store: Store) -> None:
    tenant = await make_tenant(store)
    ahead = [await _ahead_run(store, tenant.id) for _ in range(4)]
    worker = await register_worker(store, tenant.id)
    # ``max`` (3) is filled by reservations, then ``reserve`` (1) adds one more: 4.
    leased = await store.attempts_lease(worker=worker, max=3, ahead=5, reserve=1, now=at(0))
    assert sorted(a.run_id for a in leased) == sorted(r.id for r in ahead)
    other = await register_worker(store, tenant.id)
    assert await store.attempts_lease(worker=other, max=3, ahead=5, reserve=5, now=at(0)) == []
    # Without ``ahead`` nothing is reserved, ``reserve`` or not.
    more = [await _ahead_run(store, tenant.id) for _ in range(2)]
    assert await store.attempts_lease(worker=other, max=1, reserve=5, now=at(0)) == []
    both = await store.attempts_lease(worker=other, max=1, ahead=5, reserve=5, now=at(0))
    assert sorted(a.run_id for a in both) == sorted(r.id for r in more)


async def test_the_sweep_passes_over_a_lapsed_reservation_another_transaction_holds(
    store: Store,
) -> None:
    """Voiding lapsed reservations never waits on a run: one held elsewhere (its worker
    starting it, a cancel) is left for the next sweep, the others are voided at once.
    (Waiting, while holding runs taken in no set order, could deadlock a cancel.)"""
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can overlap")
    tenant = await make_tenant(store)
    held_run = await _ahead_run(store, tenant.id, heartbeat_timeout=10)
    free_run = await _ahead_run(store, tenant.id, heartbeat_timeout=10)
    worker = await register_worker(store, tenant.id)
    reserved = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(0))
    assert len(reserved) == 2
    async with engine_of(store).connect() as other:
        await other.begin()
        await other.execute(sa.select(runs.c.id).where(runs.c.id == held_run.id).with_for_update())
        assert await asyncio.wait_for(store.attempts_expire(now=at(14)), 10) == 1
        await other.rollback()
    assert await _reserved(store, [held_run.id, free_run.id]) == {held_run.id}
    assert await store.attempts_expire(now=at(14)) == 1
    assert await _reserved(store, [held_run.id, free_run.id]) == set()


async def _reserved(store: Store, run_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(
            sa.select(runs.c.id).where(runs.c.id.in_(run_ids), runs.c.reserved_token.is_not(None))
        )
        return set(rows.scalars())
