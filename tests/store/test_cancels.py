"""Cancels of running attempts, as their workers learn of them without a heartbeat:
``attempts_cancel_requested`` (the truth the cancels long-poll reads) and the notice on
``CHANNEL_CANCELS`` that wakes it (a hint)."""

from __future__ import annotations

import asyncio

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.model import CancelRequest
from cronwheel.store import Store
from cronwheel.store.notices import CHANNEL_CANCELS, parse_worker_notice
from cronwheel.store.values import CompleteItem, HeartbeatItem

from .helpers import at, leased_run, make_tenant, register_worker


async def test_a_workers_cancels_are_its_running_attempts_asked_to_stop(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    first = await register_worker(store, tenant.id)
    second = await register_worker(store, tenant.id)
    run_a, attempt_a = await leased_run(store, tenant.id, worker=first)
    _, attempt_b = await leased_run(store, tenant.id, worker=first)
    run_c, attempt_c = await leased_run(store, tenant.id, worker=second)
    assert await store.attempts_cancel_requested(worker_id=first.id) == []

    # A cancel of one run: only its worker hears of it, and of that attempt only.
    await store.runs_cancel(tenant.id, run_a.id, actor=Actor("carol"), now=at(1))
    asked_a = CancelRequest(attempt_a.attempt_id, run_a.id, attempt_a.fencing_token)
    assert await store.attempts_cancel_requested(worker_id=first.id) == [asked_a]
    assert await store.attempts_cancel_requested(worker_id=first.id, tenant_id=tenant.id) == [
        asked_a
    ]
    assert await store.attempts_cancel_requested(worker_id=first.id, tenant_id=other.id) == []
    assert await store.attempts_cancel_requested(worker_id=second.id) == []
    # What a heartbeat answers too.
    beats = await store.attempts_heartbeat_many(
        items=[
            HeartbeatItem(attempt_a.attempt_id, attempt_a.fencing_token),
            HeartbeatItem(attempt_b.attempt_id, attempt_b.fencing_token),
        ],
        now=at(2),
    )
    assert [b.cancel_requested for b in beats] == [True, False]

    # A cancel of a job: its running run's worker hears of it.
    await store.jobs_cancel(tenant.id, run_c.job_id, now=at(3))
    assert await store.attempts_cancel_requested(worker_id=second.id) == [
        CancelRequest(attempt_c.attempt_id, run_c.id, attempt_c.fencing_token)
    ]

    # Once the attempt has ended, there is nothing left to tell.
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt_a.attempt_id, attempt_a.fencing_token)], now=at(4)
    )
    assert done.ok
    assert await store.attempts_cancel_requested(worker_id=first.id) == []


async def test_a_cancel_notifies_the_worker_running_the_run(store: Store) -> None:
    """Notices are hints (a PostgreSQL LISTEN connection comes up in the background, and
    one sent before it is rightly lost): the cancel is repeated on fresh runs until one
    is heard. What is heard names the worker running the cancelled run, never another
    worker's."""
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    bystander = await register_worker(store, tenant.id)
    sub = store.subscribe(CHANNEL_CANCELS)
    try:
        heard: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while not heard and loop.time() < deadline:
            run, _ = await leased_run(store, tenant.id, worker=worker)
            await leased_run(store, tenant.id, worker=bystander)  # running on, not cancelled
            await store.runs_cancel(tenant.id, run.id, now=at(1))
            heard = await sub.wait(0.5)
    finally:
        sub.close()
    if not heard:
        pytest.fail("no notice arrived before the deadline")
    assert {parse_worker_notice(p) for p in heard} == {worker.id}
