"""A tenant's ``max_pending_runs``: what adds runs on request (creating jobs, trigger,
backfill, redrive) is refused past it with nothing stored; leased runs do not count;
creators racing on one tenant never take it past the limit together."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cronwheel.domain.errors import TenantLimitError
from cronwheel.domain.states import RunState
from cronwheel.store import Store
from cronwheel.store.sql.jobs import _PART

from .helpers import (
    T0,
    at,
    create_job,
    create_jobs,
    fire,
    leased_run,
    make_tenant,
    new_job,
)
from .test_control import recurring_job
from .test_redrive import ONE_TRY, dead_letters


async def counts(store: Store, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(jobs, runs) of the tenant."""
    jobs = await store.jobs_list(tenant_id, limit=1000)
    runs = await store.runs_list(tenant_id, limit=1000)
    return len(jobs.items), len(runs.items)


def refused(info: pytest.ExceptionInfo[TenantLimitError], *, pending: int, adding: int) -> None:
    error = info.value
    assert error.status == 429 and error.code == "limit_exceeded"
    assert error.details["limit"] == "max_pending_runs"
    assert error.details["pending"] == pending
    assert error.details["adding"] == adding
    assert "max_pending_runs" in error.message


async def test_a_batch_past_the_limit_is_refused_whole(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=3)
    await create_jobs(store, tenant.id, 2)
    before = await counts(store, tenant.id)
    with pytest.raises(TenantLimitError) as info:
        await store.jobs_create_many(tenant.id, jobs=[new_job(), new_job()], now=T0)
    refused(info, pending=2, adding=2)
    assert info.value.details["max"] == 3
    assert await counts(store, tenant.id) == before
    await create_jobs(store, tenant.id, 1)  # exactly up to the limit
    with pytest.raises(TenantLimitError):
        await create_job(store, tenant.id)


async def test_a_batch_made_in_parts_is_counted_whole(store: Store) -> None:
    # A batch large enough to be made in parts is counted with all its runs.
    count = 2 * _PART + 10
    tenant = await make_tenant(store, max_pending_runs=count + 5)
    await create_jobs(store, tenant.id, 10)
    batch = [new_job(name=f"big-{i}", due_at=at(i)) for i in range(count)]
    with pytest.raises(TenantLimitError) as info:
        await store.jobs_create_many(tenant.id, jobs=batch, now=T0)
    refused(info, pending=10, adding=count)
    assert await counts(store, tenant.id) == (10, 10)
    out = await store.jobs_create_many(tenant.id, jobs=batch[:-5], now=T0)
    assert [job.name for job, _run, _created in out] == [nj.spec.name for nj in batch[:-5]]
    assert await counts(store, tenant.id) == (count + 5, count + 5)


async def test_dispatched_runs_count_and_leased_ones_do_not(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=2)
    _job, run = await create_job(store, tenant.id)
    await fire(store, [run])
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.DISPATCHED
    await create_job(store, tenant.id, due_at=at(3600))
    with pytest.raises(TenantLimitError):
        await create_job(store, tenant.id, due_at=at(3600))
    other = await make_tenant(store, max_pending_runs=1)
    await leased_run(store, other.id)  # RUNNING: not pending
    await create_job(store, other.id, due_at=at(3600))
    with pytest.raises(TenantLimitError):
        await create_job(store, other.id, due_at=at(3600))


async def test_an_idempotent_replay_adds_nothing_and_passes(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=1)
    [(job, _run, created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(idempotency_key="k1", name="same")], now=T0
    )
    assert created
    [(again, _run, created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(idempotency_key="k1", name="same")], now=T0
    )
    assert again.id == job.id and not created


async def test_trigger_and_backfill_are_refused_past_the_limit(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=3)
    job, _scheduled = await recurring_job(store, tenant.id, due_at=at(3600))
    await store.jobs_trigger(tenant.id, job.id, now=at(1))
    # 4 past hours would make 6 pending: refused, none of them stored.
    before = await counts(store, tenant.id)
    with pytest.raises(TenantLimitError) as info:
        await store.jobs_backfill(
            tenant.id, job.id, start=at(-5 * 3600 - 60), end=at(-3600), now=at(10)
        )
    refused(info, pending=2, adding=4)
    assert await counts(store, tenant.id) == before
    [one] = await store.jobs_backfill(
        tenant.id, job.id, start=at(-2 * 3600 - 60), end=at(-3600), now=at(10)
    )
    assert one.state is RunState.SCHEDULED
    # Occurrences that have their run already add nothing: not refused at the limit.
    assert (
        await store.jobs_backfill(tenant.id, job.id, start=at(-7260), end=at(-3600), now=at(10))
        == []
    )
    with pytest.raises(TenantLimitError) as info:
        await store.jobs_trigger(tenant.id, job.id, now=at(2))
    refused(info, pending=3, adding=1)
    assert await counts(store, tenant.id) == (before[0], before[1] + 1)


async def test_redrive_is_refused_past_the_limit(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=1)
    runs = await create_jobs(store, tenant.id, 1, retry=ONE_TRY)
    [dead] = await dead_letters(store, tenant.id, runs)
    await create_job(store, tenant.id, due_at=at(3600))
    with pytest.raises(TenantLimitError):
        await store.runs_redrive(tenant.id, dead.id, now=at(10))
    with pytest.raises(TenantLimitError):
        await store.runs_redrive_many(tenant.id, run_ids=[dead.id], now=at(10))
    assert (await store.runs_get(tenant.id, dead.id)).state is RunState.DEAD_LETTER


async def test_without_the_limit_nothing_is_counted(store: Store) -> None:
    tenant = await make_tenant(store, max_concurrent_runs=1)
    assert len(await create_jobs(store, tenant.id, 50)) == 50


async def test_racing_creators_never_pass_the_limit_together(store: Store) -> None:
    tenant = await make_tenant(store, max_pending_runs=5)

    async def one() -> bool:
        try:
            await store.jobs_create_many(tenant.id, jobs=[new_job(), new_job()], now=T0)
        except TenantLimitError:
            return False
        return True

    outcomes = await asyncio.gather(*(one() for _ in range(6)))
    assert outcomes.count(True) == 2  # 2 + 2; a third would make 6
    assert await counts(store, tenant.id) == (4, 4)
