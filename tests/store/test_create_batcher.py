"""Group commit of single creates (``api/creation.py``) over the real store, both
backends: what each caller gets, which creates share a store call, and what a failing
or abandoned create does to the others.

The store's ``jobs_create_many`` is wrapped only to record each call and to hold the
first calls at a gate while the next requests queue behind them, so which creates
coalesce does not depend on how fast the database answers. Every call still reaches
the real store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import pytest

from cronwheel.api.creation import CreateBatcher, Created
from cronwheel.domain.errors import IdempotencyConflictError
from cronwheel.domain.model import NewJob
from cronwheel.store import Store

from .helpers import T0, make_tenant, new_job


@dataclass
class _Call:
    tenant_id: uuid.UUID
    names: list[str]


class _GatedStore:
    """The real store, recording each ``jobs_create_many`` and holding it at a gate
    until :meth:`open`."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._gate = asyncio.Event()
        self.calls: list[_Call] = []

    def open(self) -> None:
        self._gate.set()

    async def jobs_create_many(
        self, tenant_id: uuid.UUID, *, jobs: Sequence[NewJob], now: datetime | None = None
    ) -> list[Created]:
        self.calls.append(_Call(tenant_id, [j.spec.name for j in jobs]))
        await self._gate.wait()
        return await self._store.jobs_create_many(tenant_id, jobs=jobs, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _batcher(store: Store) -> tuple[CreateBatcher, _GatedStore]:
    gated = _GatedStore(store)
    # Two calls in flight, the most these scenarios hold at the gate (the default is
    # one, which batches the same way).
    return CreateBatcher(cast(Store, gated), in_flight=2), gated


async def _until(done: Any) -> None:
    """Let the other tasks run until ``done()`` holds (a bounded number of turns)."""
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


async def _answers(tasks: Sequence[asyncio.Task[Created]], **kw: Any) -> list[Any]:
    """Every caller's answer; a caller left waiting (no answer ever set) fails the test
    instead of hanging it."""
    async with asyncio.timeout(30):
        return list(await asyncio.gather(*tasks, **kw))


async def _start(
    batcher: CreateBatcher, gated: _GatedStore, creates: Sequence[tuple[uuid.UUID, NewJob]]
) -> list[asyncio.Task[Created]]:
    """Start ``creates`` in order and let them reach the batcher: the first two of a
    tenant in the store (held at the gate), the others queued behind them."""
    tasks = [
        asyncio.create_task(batcher.create(tenant_id, job, now=T0)) for tenant_id, job in creates
    ]
    first_calls = 2 * len({tenant_id for tenant_id, _ in creates})
    await _until(lambda: len(gated.calls) >= min(first_calls, len(creates)))
    return tasks


async def test_concurrent_creates_share_store_calls_and_each_gets_its_own_job(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    batcher, gated = _batcher(store)
    jobs = [new_job(name=f"group-{i}", due_at=T0) for i in range(20)]
    tasks = await _start(batcher, gated, [(tenant.id, j) for j in jobs])
    gated.open()
    answers = await _answers(tasks)

    assert len(gated.calls) < len(jobs)
    assert sum(batcher.batch_sizes) == len(jobs)
    assert max(batcher.batch_sizes) > 1
    # Each create in exactly one store call.
    assert sorted(n for call in gated.calls for n in call.names) == sorted(
        j.spec.name for j in jobs
    )
    for nj, (job, run, created) in zip(jobs, answers, strict=True):
        assert created
        assert (job.name, job.tenant_id) == (nj.spec.name, tenant.id)
        assert run is not None and run.job_id == job.id and run.due_at == T0
    assert len({job.id for job, _run, _created in answers}) == len(jobs)
    stored = await store.jobs_list(tenant.id, limit=100)
    assert sorted(j.name for j in stored.items) == sorted(j.spec.name for j in jobs)


async def test_a_failing_create_fails_only_its_own_caller(store: Store) -> None:
    tenant = await make_tenant(store)
    [(first, _run, _created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(name="keyed", idempotency_key="k-1")], now=T0
    )
    batcher, gated = _batcher(store)
    jobs = [new_job(name=f"ok-{i}") for i in range(6)]
    # The same key with another request, queued among others: its batch is refused.
    clash = new_job(name="other", idempotency_key="k-1")
    # The same key with the same request: the job created before, not a new one.
    again = new_job(name="keyed", idempotency_key="k-1")
    creates = [*jobs[:3], clash, again, *jobs[3:]]
    tasks = await _start(batcher, gated, [(tenant.id, j) for j in creates])
    gated.open()
    answers = await _answers(tasks, return_exceptions=True)

    assert max(batcher.batch_sizes) > 1  # the clash was queued with others
    failed = [i for i, a in enumerate(answers) if isinstance(a, BaseException)]
    assert failed == [creates.index(clash)]
    assert isinstance(answers[failed[0]], IdempotencyConflictError)
    replayed = answers[creates.index(again)]
    assert not isinstance(replayed, BaseException)
    assert (replayed[0].id, replayed[2]) == (first.id, False)
    for nj in jobs:
        answer = answers[creates.index(nj)]
        assert not isinstance(answer, BaseException)
        assert answer[0].name == nj.spec.name and answer[2]
    stored = await store.jobs_list(tenant.id, limit=100)
    assert sorted(j.name for j in stored.items) == sorted(["keyed", *(j.spec.name for j in jobs)])


async def test_two_tenants_never_share_a_batch(store: Store) -> None:
    a, b = await make_tenant(store), await make_tenant(store)
    batcher, gated = _batcher(store)
    names = {a.id: [f"a-{i}" for i in range(8)], b.id: [f"b-{i}" for i in range(8)]}
    creates = [
        (tenant_id, new_job(name=names[tenant_id][i])) for i in range(8) for tenant_id in names
    ]
    tasks = await _start(batcher, gated, creates)
    gated.open()
    answers = await _answers(tasks)

    for call in gated.calls:
        assert set(call.names) <= set(names[call.tenant_id])
    for tenant_id in names:
        calls = [c for c in gated.calls if c.tenant_id == tenant_id]
        assert len(calls) < 8  # each tenant's creates coalesced among themselves
    for (tenant_id, nj), (job, _run, created) in zip(creates, answers, strict=True):
        assert created and (job.tenant_id, job.name) == (tenant_id, nj.spec.name)
    for tenant_id in names:
        page = await store.jobs_list(tenant_id, limit=100)
        assert sorted(j.name for j in page.items) == sorted(names[tenant_id])


async def test_a_caller_cancelled_before_its_turn_is_not_stored(store: Store) -> None:
    tenant = await make_tenant(store)
    batcher, gated = _batcher(store)
    jobs = [new_job(name=f"c-{i}") for i in range(6)]
    tasks = await _start(batcher, gated, [(tenant.id, j) for j in jobs])
    # The fourth is queued behind the two held at the gate: its client goes away.
    gone = tasks[3]
    assert not gone.done()
    gone.cancel()
    gated.open()
    answers = await _answers(tasks, return_exceptions=True)

    assert isinstance(answers[3], asyncio.CancelledError)
    assert all(not isinstance(a, BaseException) for i, a in enumerate(answers) if i != 3)
    assert all(jobs[3].spec.name not in call.names for call in gated.calls)
    assert sum(batcher.batch_sizes) == len(jobs) - 1
    page = await store.jobs_list(tenant.id, limit=100)
    assert sorted(j.name for j in page.items) == sorted(
        j.spec.name for i, j in enumerate(jobs) if i != 3
    )


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_a_lone_create_is_stored_at_once_by_its_caller(store: Store, in_flight: int) -> None:
    tenant = await make_tenant(store)
    gated = _GatedStore(store)
    gated.open()
    batcher = CreateBatcher(cast(Store, gated), in_flight=in_flight)
    job, run, created = await batcher.create(tenant.id, new_job(name="alone"), now=T0)
    assert created and job.name == "alone" and run is not None
    assert [c.names for c in gated.calls] == [["alone"]]
    assert list(batcher.batch_sizes) == [1]


async def test_by_default_one_call_is_in_flight_and_the_rest_wait_for_it(store: Store) -> None:
    tenant = await make_tenant(store)
    gated = _GatedStore(store)
    batcher = CreateBatcher(cast(Store, gated))
    jobs = [new_job(name=f"one-{i}", due_at=T0) for i in range(5)]
    tasks = [asyncio.create_task(batcher.create(tenant.id, j, now=T0)) for j in jobs]
    await _until(lambda: len(gated.calls) == 1)
    for _ in range(20):  # the others stay queued while the first call is held
        await asyncio.sleep(0)
    assert [c.names for c in gated.calls] == [["one-0"]]
    gated.open()
    await _answers(tasks)
    assert [c.names for c in gated.calls] == [["one-0"], [f"one-{i}" for i in range(1, 5)]]
