"""The audit trail: one record per change, written in the change's transaction, read
newest first with filters, and leaving only by retention."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from cronwheel.domain.audit import Actor, AuditRecord
from cronwheel.domain.errors import IllegalTransitionError, NotFoundError, ValidationError
from cronwheel.domain.states import RunState
from cronwheel.store import Store

from .helpers import T0, at, create_job, engine_of, make_tenant, new_job

ALICE = Actor("k-alice", role="operator", key_id=uuid.uuid4(), request_id="req-1")
BOB = Actor("admin", role="admin", request_id="req-2")


async def _trail(store: Store, tenant_id: uuid.UUID | None) -> list[AuditRecord]:
    """The trail without the jobs' creations (``test_creations_are_audited``)."""
    items = (await store.audit_list(tenant_id, limit=500)).items
    return [r for r in items if r.action != "job.create"]


async def test_job_controls_leave_one_record_each(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(60))
    await store.jobs_pause(tenant.id, job.id, actor=ALICE, reason="deploy", now=at(1))
    await store.jobs_resume(tenant.id, job.id, actor=BOB, now=at(2))
    await store.jobs_cancel(tenant.id, job.id, actor=ALICE, reason="obsolete", now=at(3))

    cancel, resume, pause = await _trail(store, tenant.id)
    assert [r.action for r in (pause, resume, cancel)] == ["job.pause", "job.resume", "job.cancel"]
    assert (pause.actor, pause.role, pause.key_id, pause.request_id) == (
        "k-alice",
        "operator",
        ALICE.key_id,
        "req-1",
    )
    assert (resume.actor, resume.role, resume.key_id) == ("admin", "admin", None)
    assert pause.tenant_id == tenant.id
    assert (pause.target_kind, pause.target_id) == ("job", str(job.id))
    assert (pause.reason, pause.at) == ("deploy", at(1))
    assert pause.before == {"state": "active"}
    # What the change did to the job's runs: its pending run held, then released.
    assert pause.after == {"state": "paused", "runs": {"parked": 1}}
    assert resume.after == {"state": "active", "runs": {"unparked": 1}}
    assert cancel.before == {"state": "active"}
    assert cancel.after == {"state": "cancelled", "runs": {RunState.CANCELLED.value: 1}}
    assert cancel.id > resume.id > pause.id


async def test_creations_are_audited_one_record_per_request(store: Store) -> None:
    tenant = await make_tenant(store)
    one, _run = await create_job(store, tenant.id, due_at=at(60), actor=ALICE)
    # One request of many jobs (through COPY, in parts) is one record naming them all.
    batch = await store.jobs_create_many(
        tenant.id, jobs=[new_job(due_at=at(60), actor=BOB) for _ in range(300)], now=at(1)
    )
    # A key's replay creates nothing: no record.
    keyed = new_job(due_at=at(60), actor=ALICE, idempotency_key="k")
    await store.jobs_create_many(tenant.id, jobs=[keyed], now=at(2))
    await store.jobs_create_many(tenant.id, jobs=[keyed], now=at(3))

    keyed_made, many, single = (await store.audit_list(tenant.id, action="job.create")).items
    assert (single.actor, single.request_id, single.target_id) == ("k-alice", "req-1", str(one.id))
    assert single.after == {"name": one.name}
    assert (many.actor, many.target_id, many.at) == ("admin", None, at(1))
    assert many.after == {"count": 300, "jobs": [str(job.id) for job, _, _ in batch]}
    assert keyed_made.at == at(2)


async def test_a_refused_creation_leaves_no_record(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.jobs_create_many(
            uuid.uuid4(), jobs=[new_job(due_at=at(60), actor=ALICE) for _ in range(200)], now=T0
        )
    assert (await store.audit_list(None)).items == []


async def test_a_refused_change_leaves_no_record(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(60))
    await store.jobs_cancel(tenant.id, job.id, actor=ALICE, now=at(1))
    with pytest.raises(IllegalTransitionError):
        await store.jobs_pause(tenant.id, job.id, actor=ALICE, now=at(2))
    with pytest.raises(IllegalTransitionError):
        await store.jobs_cancel(tenant.id, job.id, actor=ALICE, now=at(3))
    assert [r.action for r in await _trail(store, tenant.id)] == ["job.cancel"]


async def test_a_change_without_an_actor_is_history_only(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(60))
    await store.jobs_pause(tenant.id, job.id, now=at(1))
    assert await _trail(store, tenant.id) == []


async def test_runs_tenants_keys_and_pools_are_audited(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(60))
    assert run is not None
    await store.runs_cancel(tenant.id, run.id, actor=ALICE, reason="bad input", now=at(1))
    await store.tenants_update(tenant.id, limits={"max_concurrent_runs": 3}, actor=BOB, now=at(2))
    key = await store.api_keys_create(
        tenant.id, role="viewer", key_hash="h" * 64, prefix="cw_abc", actor=BOB, now=at(3)
    )
    await store.api_keys_revoke(tenant.id, key.id, actor=BOB, reason="leaked", now=at(4))
    await store.pools_set("gpu", p0_reserved_share=0.25, actor=BOB, now=at(5))

    revoke, create, update, cancel = await _trail(store, tenant.id)
    assert (cancel.action, cancel.target_id) == ("run.cancel", str(run.id))
    assert cancel.before == {"state": "SCHEDULED"}
    assert cancel.after == {"state": "CANCELLED", "cancel_requested": False}
    assert update.action == "tenant.update"
    assert update.before == {"limits": {"max_concurrent_runs": None}}
    assert update.after == {"limits": {"max_concurrent_runs": 3}}
    assert (create.action, create.target_id) == ("key.create", str(key.id))
    assert create.after == {"role": "viewer", "prefix": "cw_abc"}
    assert (revoke.action, revoke.reason) == ("key.revoke", "leaked")
    assert revoke.after == {"revoked_at": at(4).isoformat().replace("+00:00", "Z")}
    # A pool belongs to no tenant: only the whole trail shows it.
    [pool] = (await store.audit_list(None, target_kind="pool")).items
    assert (pool.tenant_id, pool.target_id) == (None, "gpu")
    assert (pool.before, pool.after) == ({"p0_reserved_share": None}, {"p0_reserved_share": 0.25})


async def test_deleting_a_tenant_keeps_its_trail(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(60))
    await store.jobs_delete(tenant.id, job.id, actor=ALICE, reason="done", now=at(1))
    await store.tenants_delete(tenant.id, force=True, actor=BOB, reason="left", now=at(2))
    deleted_tenant, deleted_job = await _trail(store, tenant.id)
    assert (deleted_job.action, deleted_job.before) == (
        "job.delete",
        {"name": job.name, "state": "active"},
    )
    assert deleted_job.after == {"force": False, "runs_deleted": 1, "runs_stopped": 0}
    assert (deleted_tenant.action, deleted_tenant.reason) == ("tenant.delete", "left")


async def test_the_trail_filters_and_pages_newest_first(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    jobs = [(await create_job(store, tenant.id, due_at=at(600)))[0] for _ in range(5)]
    theirs, _run = await create_job(store, other.id, due_at=at(600))
    for i, job in enumerate(jobs):
        await store.jobs_pause(tenant.id, job.id, actor=ALICE if i % 2 else BOB, now=at(i))
    await store.jobs_pause(other.id, theirs.id, actor=ALICE, now=at(1))

    page = await store.audit_list(tenant.id, action="job.pause", limit=2)
    assert [r.target_id for r in page.items] == [str(jobs[4].id), str(jobs[3].id)]
    rest = await store.audit_list(tenant.id, action="job.pause", cursor=page.next_cursor, limit=10)
    assert [r.target_id for r in rest.items] == [str(j.id) for j in reversed(jobs[:3])]
    assert rest.next_cursor is None

    by_alice = await store.audit_list(tenant.id, actor="k-alice")
    assert [r.target_id for r in by_alice.items] == [str(jobs[3].id), str(jobs[1].id)]
    one = await store.audit_list(tenant.id, target_kind="job", target_id=str(jobs[2].id))
    assert [(r.action, r.at) for r in one.items] == [("job.pause", at(2)), ("job.create", T0)]
    window = await store.audit_list(tenant.id, since=at(1), until=at(3))
    assert [r.at for r in window.items] == [at(2), at(1)]
    assert (await store.audit_list(tenant.id, action="job.cancel")).items == []
    # Another tenant's records are not in a tenant's trail; the whole trail has both.
    assert {r.tenant_id for r in await _trail(store, tenant.id)} == {tenant.id}
    assert len(await _trail(store, None)) == 6


async def test_bad_queries_are_refused(store: Store) -> None:
    for cursor in ("x1", "\u00b2", "9" * 20):
        with pytest.raises(ValidationError, match="cursor"):
            await store.audit_list(None, cursor=cursor)
    with pytest.raises(ValidationError, match="until"):
        await store.audit_list(None, since=at(5), until=at(5))


async def test_retention_removes_only_older_records(store: Store) -> None:
    tenant = await make_tenant(store)
    jobs = [(await create_job(store, tenant.id, due_at=at(10**7)))[0] for _ in range(3)]
    for day, job in enumerate(jobs):
        await store.jobs_pause(tenant.id, job.id, actor=ALICE, now=T0 + timedelta(days=day * 10))
    removed = await store.audit_expire(retention_days=15, now=T0 + timedelta(days=26))
    assert removed == 2 + 3  # and the jobs' creations, at T0
    [kept] = await _trail(store, tenant.id)
    assert kept.target_id == str(jobs[2].id)
    assert await store.audit_expire(retention_days=15, now=T0 + timedelta(days=26)) == 0
    with pytest.raises(ValueError, match="retention_days"):
        await store.audit_expire(retention_days=0)


async def test_postgresql_refuses_to_change_or_remove_records(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("the append-only trigger is PostgreSQL's")
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(60))
    await store.jobs_pause(tenant.id, job.id, actor=ALICE, now=at(1))
    for statement in (
        "UPDATE audit SET actor = 'someone else'",
        "DELETE FROM audit",
        "TRUNCATE audit",
    ):
        async with engine_of(store).connect() as conn:
            with pytest.raises(sa.exc.DBAPIError, match="append-only"):
                await conn.execute(sa.text(statement))
    [record] = await _trail(store, tenant.id)
    assert record.actor == "k-alice"
