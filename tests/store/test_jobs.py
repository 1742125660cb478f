"""Jobs: creation with the first run, idempotency, listing and cancelling."""

from __future__ import annotations

import uuid

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import (
    IdempotencyConflictError,
    IllegalTransitionError,
    NotFoundError,
    ValidationError,
)
from cronwheel.domain.model import Job
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import CompleteItem, HeartbeatItem, Store
from cronwheel.store.sql.jobs import _PART

from .helpers import (
    T0,
    at,
    create_job,
    dispatched_run,
    events_of,
    job_spec,
    leased_run,
    make_tenant,
    new_job,
    register_worker,
    transitions_of,
)


async def test_create_job_writes_job_first_run_and_events(store: Store) -> None:
    tenant = await make_tenant(store)
    spec = job_spec(
        name="nightly-billing",
        payload={"region": "us"},
        pool="billing",
        requires=["python3.11"],
        tags=["billing"],
        priority=1,
        retry={"max_attempts": 5, "initial_delay": 2.0},
        timeout=600,
        heartbeat_timeout=20,
    )
    [(job, run, created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(spec, due_at=at(60), actor=Actor("alice"))], now=T0
    )
    assert created
    assert run is not None
    assert (job.tenant_id, job.name, job.state, job.kind, job.version) == (
        tenant.id,
        "nightly-billing",
        JobState.ACTIVE,
        "at",
        1,
    )
    assert job.next_due_at == at(60)
    assert job.created_at == job.updated_at == T0
    assert job.template.task == "demo.task"
    assert job.template.payload == {"region": "us"}

    assert (run.tenant_id, run.job_id, run.job_name, run.state) == (
        tenant.id,
        job.id,
        "nightly-billing",
        RunState.SCHEDULED,
    )
    assert run.due_at == run.fire_at == at(60)
    assert run.shard == shard_of(tenant.id, job.id)
    assert (run.priority, run.pool, run.requires, run.tags) == (
        1,
        "billing",
        ["python3.11"],
        ["billing"],
    )
    assert (run.task, run.webhook, run.payload) == ("demo.task", None, {"region": "us"})
    assert (run.attempt, run.max_attempts, run.timeout, run.heartbeat_timeout) == (0, 5, 600, 20)
    assert run.retry["initial_delay"] == 2.0
    assert run.created_at == T0
    assert run.dispatched_at is run.started_at is run.finished_at is None

    assert await store.jobs_get(tenant.id, job.id) == job
    assert await store.runs_get(tenant.id, run.id) == run

    history = (await store.events_list(tenant.id, job_id=job.id)).items
    assert [(e.kind, e.run_id, e.from_state, e.to_state, e.actor) for e in history] == [
        ("job.created", None, None, None, "alice"),
        ("run.transition", run.id, None, "SCHEDULED", "alice"),
    ]
    assert all(e.at == T0 for e in history)


async def test_create_many_jobs_in_one_batch(store: Store) -> None:
    tenant = await make_tenant(store)
    batch = [new_job(name=f"bulk-{i:03}", due_at=at(i)) for i in range(60)]
    batch.append(new_job(name="later", due_at=None))
    out = await store.jobs_create_many(tenant.id, jobs=batch, now=T0)

    assert [job.name for job, _run, _created in out] == [nj.spec.name for nj in batch]
    assert all(created for _job, _run, created in out)
    assert len({job.id for job, _run, _created in out}) == 61
    runs = [run for _job, run, _created in out]
    assert runs[-1] is None  # nothing to materialise yet
    for i, (job, run, _created) in enumerate(out[:-1]):
        assert run is not None
        assert (run.job_id, run.due_at) == (job.id, at(i))

    listed = await store.runs_list(tenant.id, limit=1000)
    assert len(listed.items) == 60
    kinds = [e.kind for e in (await store.events_list(tenant.id, limit=1000)).items]
    assert kinds.count("job.created") == 61
    assert kinds.count("run.transition") == 60


async def test_a_large_batch_is_made_and_stored_in_parts_as_one(store: Store) -> None:
    # Past a part's size, the rows are made part by part while the parts before are
    # inserted: the answer and what is stored are those of one batch.
    tenant = await make_tenant(store)
    count = 2 * _PART + 44
    batch = [
        new_job(name=f"part-{i:03}", due_at=None if i % 50 == 7 else at(i)) for i in range(count)
    ]
    out = await store.jobs_create_many(tenant.id, jobs=batch, now=T0)
    assert [job.name for job, _run, _created in out] == [nj.spec.name for nj in batch]
    assert all(created for _job, _run, created in out)
    for job, run, _created in out:
        assert await store.jobs_get(tenant.id, job.id) == job
        if run is None:
            assert job.next_due_at is None
        else:
            assert await store.runs_get(tenant.id, run.id) == run
    with_runs = [run for _job, run, _created in out if run is not None]
    assert len(with_runs) == count - len([i for i in range(count) if i % 50 == 7])
    assert len((await store.runs_list(tenant.id, limit=1000)).items) == len(with_runs)
    kinds = [e.kind for e in (await store.events_list(tenant.id, limit=1000)).items]
    assert kinds.count("job.created") == count
    assert kinds.count("run.transition") == len(with_runs)


async def test_idempotency_key_replays_the_same_job(store: Store) -> None:
    tenant = await make_tenant(store)
    [(job, run, created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(job_spec(name="once"), idempotency_key="k1")], now=T0
    )
    assert created
    assert job.idempotency_key == "k1"
    events_before = (await store.events_list(None, limit=1000)).items

    # A retry of the same request, built afresh, some time later.
    [(again, again_run, again_created)] = await store.jobs_create_many(
        tenant.id, jobs=[new_job(job_spec(name="once"), idempotency_key="k1")], now=at(30)
    )
    assert not again_created
    assert again == job
    assert again_run == run
    assert (await store.events_list(None, limit=1000)).items == events_before

    mixed = await store.jobs_create_many(
        tenant.id,
        jobs=[
            new_job(job_spec(name="once"), idempotency_key="k1"),
            new_job(job_spec(name="fresh"), idempotency_key="k2"),
        ],
        now=at(40),
    )
    (replayed, _run, replay_created), (fresh, _fresh_run, fresh_created) = mixed
    assert (replayed.id, replay_created) == (job.id, False)
    assert fresh_created
    assert fresh.id != job.id
    assert len((await store.jobs_list(tenant.id)).items) == 2

    # Keys belong to their tenant: another tenant's same key is a new job.
    other = await make_tenant(store)
    [(theirs, _run, theirs_created)] = await store.jobs_create_many(
        other.id, jobs=[new_job(job_spec(name="once"), idempotency_key="k1")], now=T0
    )
    assert theirs_created
    assert theirs.id != job.id


async def test_idempotency_conflict_writes_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    await store.jobs_create_many(
        tenant.id, jobs=[new_job(job_spec(name="original"), idempotency_key="k1")], now=T0
    )
    events_before = (await store.events_list(None, limit=1000)).items
    jobs_before = (await store.jobs_list(tenant.id)).items
    runs_before = (await store.runs_list(tenant.id)).items

    with pytest.raises(IdempotencyConflictError):
        await store.jobs_create_many(
            tenant.id,
            jobs=[
                new_job(job_spec(name="innocent bystander")),
                new_job(job_spec(name="a different request"), idempotency_key="k1"),
            ],
            now=at(1),
        )

    assert (await store.events_list(None, limit=1000)).items == events_before
    assert (await store.jobs_list(tenant.id)).items == jobs_before
    assert (await store.runs_list(tenant.id)).items == runs_before


async def test_unknown_tenant_writes_nothing(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.jobs_create_many(uuid.uuid4(), jobs=[new_job(), new_job()], now=T0)
    assert sum((await store.runs_count_by_state()).values()) == 0
    assert (await store.events_list(None)).items == []


async def _names(
    store: Store,
    tenant_id: uuid.UUID,
    *,
    state: str | None = None,
    tag: str | None = None,
    name_prefix: str | None = None,
) -> set[str]:
    page = await store.jobs_list(tenant_id, state=state, tag=tag, name_prefix=name_prefix)
    return {j.name for j in page.items}


async def test_jobs_list_filters(store: Store) -> None:
    tenant = await make_tenant(store)
    tags = {
        "billing-eu": ["billing"],
        "billing-us": ["billing", "us"],
        "reports": ["us"],
        "50%_off": [],
        "50xxoff": [],
        "a_b": [],
        "axb": [],
        "a/b": [],
        "Billing-legacy": [],
        "BILLING-x": [],
        "café-1": [],
        "CAFÉ-2": [],
    }
    jobs: dict[str, Job] = {}
    for name, job_tags in tags.items():
        jobs[name], _run = await create_job(store, tenant.id, name=name, tags=job_tags)
    await store.jobs_cancel(tenant.id, jobs["reports"].id, now=at(1))

    assert await _names(store, tenant.id, state="cancelled") == {"reports"}
    assert await _names(store, tenant.id, state="active") == set(tags) - {"reports"}
    assert await _names(store, tenant.id, tag="us") == {"billing-us", "reports"}
    assert await _names(store, tenant.id, tag="bill") == set()
    assert await _names(store, tenant.id, tag="us", state="active") == {"billing-us"}
    # Prefixes match case-sensitively on every backend.
    assert await _names(store, tenant.id, name_prefix="billing-") == {"billing-eu", "billing-us"}
    assert await _names(store, tenant.id, name_prefix="Billing") == {"Billing-legacy"}
    assert await _names(store, tenant.id, name_prefix="café") == {"café-1"}
    assert await _names(store, tenant.id, name_prefix="CAFÉ-") == {"CAFÉ-2"}
    # LIKE wildcards in a prefix are plain characters.
    assert await _names(store, tenant.id, name_prefix="50%") == {"50%_off"}
    assert await _names(store, tenant.id, name_prefix="50%_") == {"50%_off"}
    assert await _names(store, tenant.id, name_prefix="a_") == {"a_b"}
    assert await _names(store, tenant.id, name_prefix="a/") == {"a/b"}
    assert await _names(store, tenant.id, name_prefix="%") == set()
    assert await _names(store, tenant.id, name_prefix="_") == set()


async def test_jobs_list_pages_newest_first(store: Store) -> None:
    tenant = await make_tenant(store)
    created = [
        (await create_job(store, tenant.id, now=at(i), name=f"j{i}"))[0].id for i in range(7)
    ]
    seen: list[uuid.UUID] = []
    cursor: str | None = None
    while True:
        page = await store.jobs_list(tenant.id, cursor=cursor, limit=3)
        assert len(page.items) <= 3
        seen += [j.id for j in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == created[::-1]
    filtered = await store.jobs_list(tenant.id, name_prefix="j", limit=7)
    assert filtered.next_cursor is None
    assert len(filtered.items) == 7
    with pytest.raises(ValidationError):
        await store.jobs_list(tenant.id, cursor="garbage")


async def test_jobs_cancel_cancels_pending_runs(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(store, tenant.id, due_at=at(60))
    cancelled = await store.jobs_cancel(
        tenant.id, job.id, actor=Actor("bob"), reason="no longer needed", now=at(5)
    )
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.next_due_at is None
    assert cancelled.version == job.version + 1
    assert await store.jobs_get(tenant.id, job.id) == cancelled

    after = await store.runs_get(tenant.id, run.id)
    assert after.state is RunState.CANCELLED
    assert after.finished_at == at(5)
    assert await transitions_of(store, tenant.id, run.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "CANCELLED"),
    ]
    history = (await store.events_list(tenant.id, job_id=job.id)).items
    assert ("job.cancelled", "bob", "no longer needed") in [
        (e.kind, e.actor, e.reason) for e in history
    ]
    events_before = (await store.events_list(tenant.id, limit=1000)).items

    with pytest.raises(IllegalTransitionError):
        await store.jobs_cancel(tenant.id, job.id, now=at(6))
    assert await store.jobs_get(tenant.id, job.id) == cancelled
    assert (await store.events_list(tenant.id, limit=1000)).items == events_before

    # A cancelled run is never fired.
    assert await store.runs_due_scan(shards=[run.shard], until=at(3600)) == []


async def test_jobs_cancel_dispatched_and_running_runs(store: Store) -> None:
    tenant = await make_tenant(store)
    running, attempt = await leased_run(store, tenant.id)
    ready = await dispatched_run(store, tenant.id)

    await store.jobs_cancel(tenant.id, ready.job_id, now=at(1))
    await store.jobs_cancel(tenant.id, running.job_id, now=at(1))

    ready_after = await store.runs_get(tenant.id, ready.id)
    assert ready_after.state is RunState.CANCELLED
    assert ready_after.finished_at == at(1)
    assert (await transitions_of(store, tenant.id, ready.id))[-1] == ("DISPATCHED", "CANCELLED")
    worker = await register_worker(store, tenant.id)
    assert await store.attempts_lease(worker=worker, max=10, now=at(2)) == []

    # A running run is asked to stop; the worker hears of it on its next heartbeat.
    running_after = await store.runs_get(tenant.id, running.id)
    assert running_after.state is RunState.RUNNING
    assert running_after.finished_at is None
    [beat] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(attempt.attempt_id, attempt.fencing_token)], now=at(2)
    )
    assert beat.ok
    assert beat.cancel_requested
    kinds = [e.kind for e in await events_of(store, tenant.id, run_id=running.id)]
    assert "run.cancel_requested" in kinds

    # A finished job cannot be cancelled.
    finished, finished_attempt = await leased_run(store, tenant.id, worker=worker)
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(finished_attempt.attempt_id, finished_attempt.fencing_token)],
        now=at(3),
    )
    assert done.ok
    assert (await store.jobs_get(tenant.id, finished.job_id)).state is JobState.FINISHED
    with pytest.raises(IllegalTransitionError):
        await store.jobs_cancel(tenant.id, finished.job_id, now=at(4))
    assert (await store.jobs_get(tenant.id, finished.job_id)).state is JobState.FINISHED
