"""Deleting jobs and tenants: what goes, what stays (the audit trail), what is refused
while still in progress, and what a worker still running a deleted run is told."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import InUseError, NotFoundError, StaleFencingTokenError
from cronwheel.domain.model import Event
from cronwheel.domain.states import RunState
from cronwheel.store import CompleteItem, HeartbeatItem, RunFilter, Store
from cronwheel.store.sql.deletion import TOMBSTONE_TTL

from .helpers import (
    T0,
    at,
    create_job,
    dispatched_run,
    leased_run,
    make_tenant,
    register_worker,
)


async def _audit(store: Store, tenant_id: uuid.UUID | None, kind: str) -> list[Event]:
    page = await store.events_list(tenant_id, limit=1000)
    return [e for e in page.items if e.kind == kind]


async def test_a_deleted_job_takes_its_runs_attempts_and_run_events_and_leaves_its_audit(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)
    await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(1)
    )
    job = await store.jobs_get(tenant.id, run.job_id)
    assert job.state.value == "finished"  # a finished job keeps its history until deleted
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SUCCESS
    assert len(await store.attempts_list(tenant.id, run_id=run.id)) == 1

    deleted = await store.jobs_delete(
        tenant.id, job.id, actor=Actor("k1", role="operator"), reason="obsolete", now=at(3)
    )
    assert (deleted.id, deleted.name, deleted.runs, deleted.stopped) == (job.id, job.name, 1, [])
    assert deleted.attempted == [run.id] and deleted.at == at(3)

    with pytest.raises(NotFoundError):
        await store.jobs_get(tenant.id, job.id)
    with pytest.raises(NotFoundError):
        await store.runs_get(tenant.id, run.id)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []
    assert (await store.runs_list(tenant.id, filter=RunFilter(job_id=job.id))).items == []

    history = (await store.events_list(tenant.id, job_id=job.id, limit=1000)).items
    assert all(e.run_id is None for e in history)
    assert [e.kind for e in history] == ["job.created", "job.deleted"]
    record = history[-1]
    assert (record.actor, record.reason, record.at) == ("k1", "obsolete", at(3))
    assert record.data["name"] == job.name and record.data["role"] == "operator"
    assert record.data["state"] == "finished" and record.data["runs"] == 1
    # The admin's view of every tenant finds it too.
    assert [e.id for e in await _audit(store, None, "job.deleted")] == [record.id]


async def test_a_job_with_runs_in_progress_is_refused_and_kept(store: Store) -> None:
    tenant = await make_tenant(store)
    dispatched = await dispatched_run(store, tenant.id)
    running, _attempt = await leased_run(store, tenant.id, now=at(1), pool="other")
    for run, state in ((dispatched, "DISPATCHED"), (running, "RUNNING")):
        with pytest.raises(InUseError) as refused:
            await store.jobs_delete(tenant.id, run.job_id, now=at(2))
        assert str(run.id) in refused.value.message and state in refused.value.message
        assert refused.value.details["runs"] == [{"id": str(run.id), "state": state}]
        assert (await store.runs_get(tenant.id, run.id)).state.value == state
        assert (await store.jobs_get(tenant.id, run.job_id)).id == run.job_id
    assert await _audit(store, tenant.id, "job.deleted") == []


async def test_force_ends_runs_in_progress_and_their_attempts_answer_stale(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    run, attempt = await leased_run(store, tenant.id, worker=worker)

    deleted = await store.jobs_delete(tenant.id, run.job_id, force=True, now=at(1))
    assert deleted.stopped == [(run.id, "RUNNING")]
    [record] = await _audit(store, tenant.id, "job.deleted")
    assert record.data["force"] is True

    # The worker's later reports are stale, never unknown, and bring nothing back.
    token = attempt.fencing_token
    for scope in (tenant.id, None):
        [done] = await store.attempts_complete_many(
            items=[CompleteItem(attempt.attempt_id, token)], tenant_id=scope, now=at(2)
        )
        assert (done.ok, done.error_code) == (False, "stale_fencing_token")
    [beat] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(attempt.attempt_id, token)], now=at(2)
    )
    assert (beat.ok, beat.error_code) == (False, "stale_fencing_token")
    with pytest.raises(StaleFencingTokenError):
        await store.attempts_get_live(attempt_id=attempt.attempt_id, fencing_token=token)
    with pytest.raises(NotFoundError):
        await store.runs_get(tenant.id, run.id)
    assert await store.attempts_list(tenant.id, run_id=run.id) == []

    # Another tenant does not see the tombstone: unknown to it, as before.
    other = await make_tenant(store)
    [foreign] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, token)], tenant_id=other.id, now=at(2)
    )
    assert foreign.error_code == "not_found"
    [unknown] = await store.attempts_complete_many(
        items=[CompleteItem(uuid.uuid4(), token)], now=at(2)
    )
    assert unknown.error_code == "not_found"


async def test_tombstones_are_purged_once_no_attempt_can_be_alive(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)
    await store.jobs_delete(tenant.id, run.job_id, force=True, now=at(1))
    later = at(1) + TOMBSTONE_TTL + timedelta(seconds=1)
    _job, other = await create_job(store, tenant.id, due_at=later, now=later)
    await store.jobs_delete(tenant.id, other.job_id, now=later)
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=later
    )
    assert done.error_code == "not_found"


async def test_another_tenants_job_is_not_found_and_untouched(store: Store) -> None:
    owner, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(store, owner.id)
    with pytest.raises(NotFoundError):
        await store.jobs_delete(other.id, job.id, force=True, now=at(1))
    with pytest.raises(NotFoundError):
        await store.jobs_delete(owner.id, uuid.uuid4(), now=at(1))
    assert (await store.runs_get(owner.id, run.id)).state is RunState.SCHEDULED
    assert await _audit(store, None, "job.deleted") == []


async def test_a_job_with_only_pending_runs_is_deleted_without_force(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(store, tenant.id, due_at=at(3600))
    deleted = await store.jobs_delete(tenant.id, job.id, now=T0)
    assert (deleted.runs, deleted.stopped, deleted.attempted) == (1, [], [])
    with pytest.raises(NotFoundError):
        await store.runs_get(tenant.id, run.id)


# -- tenants -------------------------------------------------------------------------


async def test_a_tenant_with_live_jobs_is_refused_until_they_are_over(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(3600))
    with pytest.raises(InUseError) as refused:
        await store.tenants_delete(tenant.id, now=at(1))
    assert str(job.id) in refused.value.message and "active" in refused.value.message
    assert (await store.tenants_get(tenant.id)).id == tenant.id

    await store.jobs_cancel(tenant.id, job.id, now=at(2))
    await store.api_keys_create(
        tenant.id, role="operator", key_hash="d" * 64, prefix="cw_dddd", now=at(2)
    )
    await register_worker(store, tenant.id)
    deleted = await store.tenants_delete(
        tenant.id, actor=Actor("admin", role="admin"), reason="team left", now=at(3)
    )
    assert (deleted.name, deleted.jobs, deleted.runs, deleted.api_keys, deleted.workers) == (
        tenant.name,
        1,
        1,
        1,
        1,
    )
    with pytest.raises(NotFoundError):
        await store.tenants_get(tenant.id)
    assert await store.api_keys_get_by_hash(key_hash="d" * 64) is None
    assert (await store.jobs_list(tenant.id)).items == []
    assert (await store.runs_list(tenant.id)).items == []

    [record] = await _audit(store, None, "tenant.deleted")
    assert record.tenant_id == tenant.id
    assert (record.actor, record.reason) == ("admin", "team left")
    assert record.data["name"] == tenant.name and record.data["jobs"] == 1
    # The tenant's audit trail stays; its runs' history went with them.
    kinds = {e.kind for e in (await store.events_list(tenant.id, limit=1000)).items}
    assert {"tenant.created", "job.created", "job.cancelled", "tenant.deleted"} <= kinds
    assert "run.transition" not in kinds


async def test_force_deletes_a_busy_tenant_and_its_workers_reports_are_stale(
    store: Store,
) -> None:
    tenant, neighbour = await make_tenant(store), await make_tenant(store)
    worker = await register_worker(store, None)  # serves every tenant
    run, attempt = await leased_run(store, tenant.id, worker=worker)
    kept, _ = await create_job(store, neighbour.id, due_at=at(60))

    with pytest.raises(InUseError) as refused:
        await store.tenants_delete(tenant.id, now=at(1))
    assert "RUNNING" in refused.value.message
    deleted = await store.tenants_delete(tenant.id, force=True, now=at(1))
    assert deleted.stopped == [(run.id, "RUNNING")]

    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(2)
    )
    assert (done.ok, done.error_code) == (False, "stale_fencing_token")
    assert (await store.jobs_get(neighbour.id, kept.id)).id == kept.id
    with pytest.raises(NotFoundError):
        await store.tenants_delete(tenant.id, force=True, now=at(3))


async def test_nothing_is_added_for_a_deleted_tenant(store: Store) -> None:
    """A key an API node still holds in its cache past its tenant's deletion finds the
    tenant gone: not found, never a row left without its tenant (or a database error)."""
    tenant = await make_tenant(store)
    await store.tenants_delete(tenant.id, now=at(1))
    with pytest.raises(NotFoundError):
        await register_worker(store, tenant.id)
    with pytest.raises(NotFoundError):
        await create_job(store, tenant.id, due_at=at(60))
    with pytest.raises(NotFoundError):
        await store.api_keys_create(
            tenant.id, role="worker", key_hash="e" * 64, prefix="cw_eeee", now=at(2)
        )
    assert (await store.workers_list(None)).items == []
