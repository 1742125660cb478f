"""Tenant isolation inside the store: another tenant's id behaves like an unknown id."""

from __future__ import annotations

import uuid

import pytest

from cronwheel.domain.errors import NotFoundError
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import HeartbeatItem, RunFilter, Store

from .helpers import at, create_job, leased_run, make_tenant


async def test_other_tenants_objects_are_not_found(store: Store) -> None:
    mine = await make_tenant(store)
    theirs = await make_tenant(store)
    await create_job(store, mine.id, name="mine")
    run, attempt = await leased_run(store, theirs.id, name="theirs")
    _job, pending = await create_job(store, theirs.id, name="theirs-pending", due_at=at(60))
    events_before = (await store.events_list(None, limit=1000)).items

    for job_id in (run.job_id, pending.job_id, uuid.uuid4()):
        with pytest.raises(NotFoundError):
            await store.jobs_get(mine.id, job_id)
        with pytest.raises(NotFoundError):
            await store.jobs_cancel(mine.id, job_id, now=at(1))
    for run_id in (run.id, pending.id, uuid.uuid4()):
        with pytest.raises(NotFoundError):
            await store.runs_get(mine.id, run_id)
        with pytest.raises(NotFoundError):
            await store.runs_cancel(mine.id, run_id, now=at(1))
        assert await store.attempts_list(mine.id, run_id=run_id) == []
        assert (await store.events_list(mine.id, run_id=run_id)).items == []
    assert (await store.events_list(mine.id, job_id=run.job_id)).items == []

    assert {j.name for j in (await store.jobs_list(mine.id)).items} == {"mine"}
    assert {r.job_name for r in (await store.runs_list(mine.id)).items} == {"mine"}
    filtered = await store.runs_list(mine.id, filter=RunFilter(job_id=run.job_id))
    assert filtered.items == []
    assert all(e.tenant_id == mine.id for e in (await store.events_list(mine.id)).items)

    # Nothing of theirs moved.
    assert (await store.events_list(None, limit=1000)).items == events_before
    assert (await store.jobs_get(theirs.id, run.job_id)).state is JobState.ACTIVE
    assert (await store.runs_get(theirs.id, pending.id)).state is RunState.SCHEDULED
    [beat] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(attempt.attempt_id, attempt.fencing_token)], now=at(2)
    )
    assert beat.ok
    assert not beat.cancel_requested
    assert len(await store.attempts_list(theirs.id, run_id=run.id)) == 1
