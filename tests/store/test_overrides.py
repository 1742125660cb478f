"""Runtime parameter overrides (``overrides_*``): the runs each scope reaches, the merge
order, what a run records, and what an override cannot do — on both backends."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import (
    ConflictError,
    IllegalTransitionError,
    NotFoundError,
    PayloadTooLargeError,
    ValidationError,
)
from cronwheel.domain.model import Job, NewJob, Run
from cronwheel.domain.overrides import OverrideScope
from cronwheel.domain.states import RunState
from cronwheel.store import RunFilter, Store
from cronwheel.store.schema import overrides
from cronwheel.timing import first_due

from .helpers import (
    T0,
    at,
    create_job,
    engine_of,
    events_of,
    fire,
    hold_all_shards,
    job_spec,
    make_tenant,
    register_worker,
)
from .test_edits import edit

BOB = Actor("k-bob", role="operator", key_id=uuid.uuid4(), request_id="req-ov")
EVERY_MINUTE = {"cron": "* * * * *", "timezone": "UTC"}
PAYLOAD = {"region": "eu", "batch": {"size": 100, "dry": False}, "keep": 1}


async def minutely(store: Store, tenant_id: uuid.UUID, **fields: Any) -> tuple[Job, Run]:
    """A job due every minute from T0 + 1 min, with PAYLOAD."""
    spec = job_spec(schedule=EVERY_MINUTE, payload=PAYLOAD, **fields)
    due = first_due(spec.schedule, at(1), max_horizon=timedelta(days=1), past_grace=timedelta(0))
    [(job, run, _)] = await store.jobs_create_many(
        tenant_id, jobs=[NewJob(spec=spec, first_due_at=due)], now=T0
    )
    assert run is not None and run.due_at == at(60)
    return job, run


async def override(store: Store, job: Job, scope: OverrideScope, **values: Any) -> Any:
    made, _reached = await store.overrides_create(
        job.tenant_id, scope=scope, job_id=job.id, actor=BOB, now=T0, **values
    )
    return made


async def job_runs(store: Store, job: Job) -> list[Run]:
    page = await store.runs_list(job.tenant_id, filter=RunFilter(job_id=job.id), limit=100)
    return sorted(page.items, key=lambda r: r.due_at)


async def fire_due(store: Store, run: Run) -> Run:
    """Fire ``run`` at its instant; answers the next occurrence firing made."""
    await fire(store, [run], now=run.due_at)
    [following] = [r for r in await job_runs_of(store, run) if r.due_at > run.due_at]
    return following


async def job_runs_of(store: Store, run: Run) -> list[Run]:
    page = await store.runs_list(run.tenant_id, filter=RunFilter(job_id=run.job_id), limit=100)
    return sorted(page.items, key=lambda r: r.due_at)


# -- scopes ------------------------------------------------------------------------------


async def test_a_future_override_reaches_the_pending_run_and_every_run_made_after(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    job, run = await minutely(store, tenant.id)
    made, reached = await store.overrides_create(
        tenant.id,
        scope=OverrideScope.FUTURE,
        job_id=job.id,
        payload={"region": "us", "batch": {"dry": True}, "keep": None},
        timeout=30.0,
        priority=0,
        pool="big",
        reason="eu is down",
        actor=BOB,
        now=T0,
    )
    assert reached == [run.id]
    assert (made.scope, made.run_id, made.status, made.created_by) == (
        OverrideScope.FUTURE,
        None,
        "active",
        "k-bob",
    )
    wanted = {"region": "us", "batch": {"size": 100, "dry": True}}
    got = await store.runs_get(tenant.id, run.id)
    assert (got.payload, got.timeout, got.priority, got.pool) == (wanted, 30.0, 0, "big")
    assert got.override_ids == [made.id]
    assert got.base == {"payload": PAYLOAD, "timeout": 3600.0, "priority": 2, "pool": "default"}
    # The job's definition is untouched.
    assert (await store.jobs_get(tenant.id, job.id)).template.payload == PAYLOAD

    # The scheduler makes the next occurrences with it: the next-occurrence statement
    # (SQL on PostgreSQL, Python on SQLite) reads the job's overlay.
    await hold_all_shards(store, now=at(60))
    second = await fire_due(store, got)
    assert (second.payload, second.timeout, second.priority, second.pool) == (
        wanted,
        30.0,
        0,
        "big",
    )
    assert second.override_ids == [made.id]

    # The first run starts with it and keeps it.
    worker = await register_worker(store, tenant.id, pool="big")
    [leased] = await store.attempts_lease(worker=worker, max=1, now=at(60))
    assert (leased.run_id, leased.payload) == (run.id, wanted)

    # Removed: the unstarted run gets its base back; later runs are made without it.
    removed, restored = await store.overrides_remove(
        tenant.id, made.id, job_id=job.id, actor=BOB, reason="eu is back", now=at(61)
    )
    assert (removed.status, removed.removed_by, restored) == ("removed", "k-bob", [second.id])
    back = await store.runs_get(tenant.id, second.id)
    assert (back.payload, back.timeout, back.priority, back.pool) == (
        PAYLOAD,
        3600.0,
        2,
        "default",
    )
    assert (back.override_ids, back.base) == ([], None)
    third = await fire_due(store, await store.runs_get(tenant.id, second.id))
    assert (third.payload, third.override_ids) == (PAYLOAD, [])
    first = await store.runs_get(tenant.id, run.id)
    assert (first.state, first.payload, first.override_ids) == (
        RunState.RUNNING,
        wanted,
        [made.id],
    )


async def test_the_merge_order_is_job_future_next_run(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await minutely(store, tenant.id)
    # Made in the reverse of the merge order: the order is the scope's, not the time's.
    own, _ = await store.overrides_create(
        tenant.id,
        scope=OverrideScope.RUN,
        run_id=run.id,
        payload={"region": "run", "batch": {"size": 3}},
        now=T0,
    )
    following = await override(
        store, job, OverrideScope.NEXT, payload={"region": "next", "n": 1}, priority=1
    )
    futures = [
        await override(store, job, OverrideScope.FUTURE, payload={"region": "f1", "f": 1}),
        await override(store, job, OverrideScope.FUTURE, payload={"region": "f2"}, priority=3),
    ]
    got = await store.runs_get(tenant.id, run.id)
    assert got.payload == {
        "region": "run",
        "batch": {"size": 3, "dry": False},
        "keep": 1,
        "n": 1,
        "f": 1,
    }
    assert got.priority == 1  # next (1) over the newer future (3)
    assert got.override_ids == [futures[0].id, futures[1].id, following.id, own.id]
    listed = await store.overrides_list(tenant.id, run_id=run.id)
    assert [o.id for o in listed] == got.override_ids

    # Removing the run's own override leaves the rest applied, in order.
    await store.overrides_remove(tenant.id, own.id, run_id=run.id, now=T0)
    got = await store.runs_get(tenant.id, run.id)
    assert got.payload["region"] == "next"
    assert got.payload["batch"] == {"size": 100, "dry": False}
    assert got.override_ids == [futures[0].id, futures[1].id, following.id]


async def test_next_is_bound_to_the_next_occurrence_and_consumed_with_it(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await minutely(store, tenant.id)
    made = await override(store, job, OverrideScope.NEXT, payload={"tonight": True})
    assert made.run_id == run.id
    await hold_all_shards(store, now=at(60))
    second = await fire_due(store, run)
    assert second.payload == PAYLOAD and second.override_ids == []
    worker = await register_worker(store, tenant.id)
    [leased] = await store.attempts_lease(worker=worker, max=10, now=at(60))
    assert (leased.run_id, leased.payload) == (run.id, {**PAYLOAD, "tonight": True})

    [consumed] = await store.overrides_list(tenant.id, job_id=job.id, ended=True)
    assert (consumed.id, consumed.status) == (made.id, "consumed")
    assert await store.overrides_list(tenant.id, job_id=job.id) == []
    with pytest.raises(ConflictError, match="consumed"):
        await store.overrides_remove(tenant.id, made.id, job_id=job.id, now=at(61))
    # A run override on the started run is refused; nothing is stored.
    with pytest.raises(ConflictError, match="RUNNING"):
        await store.overrides_create(
            tenant.id, scope=OverrideScope.RUN, run_id=run.id, payload={"x": 1}, now=at(61)
        )
    assert len(await store.overrides_list(tenant.id, job_id=job.id, ended=True)) == 1
    # The next one now is the second occurrence.
    again = await override(store, job, OverrideScope.NEXT, timeout=5.0)
    assert again.run_id == second.id


async def test_an_override_reaches_a_run_dispatched_ahead_and_voids_its_reservation(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(3), now=T0, payload={"a": 1})
    await hold_all_shards(store)
    fired = await store.runs_fire(run_ids=[run.id], node_id="node-a", now=T0, lead=5)
    assert [f.id for f in fired] == [run.id]
    worker = await register_worker(store, tenant.id)
    [reserved] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(0))
    assert reserved.payload == {"a": 1}

    _made, reached = await store.overrides_create(
        tenant.id, scope=OverrideScope.RUN, run_id=run.id, payload={"a": 2}, now=at(1)
    )
    assert reached == [run.id]
    # The worker holding the old payload is refused at the start...
    refused = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3)
    )
    assert refused.refused == [reserved.fencing_token]
    # ... and the run goes out again, with the new one.
    [fresh] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(2))
    assert (fresh.run_id, fresh.payload) == (run.id, {"a": 2})
    assert fresh.fencing_token > reserved.fencing_token


async def test_a_template_edit_keeps_the_overrides_over_the_new_template(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await minutely(store, tenant.id)
    made = await override(store, job, OverrideScope.FUTURE, payload={"region": "us"}, pool="big")
    await edit(store, job, payload={"region": "eu", "v": 2}, timeout=99)
    got = await store.runs_get(tenant.id, run.id)
    assert (got.payload, got.pool, got.timeout) == ({"region": "us", "v": 2}, "big", 99.0)
    assert got.base == {"payload": {"region": "eu", "v": 2}, "timeout": 99.0, "priority": 2,
                        "pool": "default"}  # fmt: skip
    # The next occurrence is made on the new template too.
    await hold_all_shards(store, now=at(60))
    second = await fire_due(store, got)
    assert (second.payload, second.pool, second.timeout, second.override_ids) == (
        {"region": "us", "v": 2},
        "big",
        99.0,
        [made.id],
    )


async def test_a_trigger_and_a_backfill_take_the_future_overrides(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await minutely(store, tenant.id)
    made = await override(store, job, OverrideScope.FUTURE, payload={"keep": 9}, priority=0)
    triggered = await store.jobs_trigger(tenant.id, job.id, payload={"extra": 1}, now=at(5))
    assert triggered.payload == {**PAYLOAD, "extra": 1, "keep": 9}
    assert (triggered.priority, triggered.override_ids) == (0, [made.id])
    assert triggered.base is not None and triggered.base["payload"] == {**PAYLOAD, "extra": 1}
    filled = await store.jobs_backfill(tenant.id, job.id, start=at(-180), end=at(-60), now=at(5))
    assert filled and all(r.payload["keep"] == 9 and r.priority == 0 for r in filled)


# -- what cannot be overridden -------------------------------------------------------------


async def test_refusals_change_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    job, run = await minutely(store, tenant.id, progress_timeout=60)

    async def refused(error: type[Exception], match: str, **kwargs: Any) -> None:
        with pytest.raises(error, match=match):
            await store.overrides_create(tenant.id, now=T0, **kwargs)

    await refused(NotFoundError, "run", scope=OverrideScope.RUN, run_id=uuid.uuid4(), timeout=5.0)
    await refused(
        NotFoundError, "job", scope=OverrideScope.FUTURE, job_id=uuid.uuid4(), timeout=5.0
    )
    await refused(ValidationError, "changes nothing", scope=OverrideScope.FUTURE, job_id=job.id)
    await refused(
        ValidationError, "progress_timeout", scope=OverrideScope.FUTURE, job_id=job.id, timeout=5.0
    )
    await refused(
        PayloadTooLargeError,
        "payload",
        scope=OverrideScope.NEXT,
        job_id=job.id,
        payload={"blob": "x" * 70_000},
        max_payload_bytes=64 * 1024,
    )
    # Another tenant's job and run are not found, and not touched.
    with pytest.raises(NotFoundError):
        await store.overrides_create(
            other.id, scope=OverrideScope.RUN, run_id=run.id, timeout=80.0, now=T0
        )
    with pytest.raises(NotFoundError):
        await store.overrides_create(
            other.id, scope=OverrideScope.FUTURE, job_id=job.id, timeout=80.0, now=T0
        )
    assert await store.overrides_list(tenant.id, job_id=job.id, ended=True) == []
    got = await store.runs_get(tenant.id, run.id)
    assert (got.payload, got.timeout, got.override_ids) == (PAYLOAD, 3600.0, [])

    made = await override(store, job, OverrideScope.FUTURE, timeout=80.0)
    with pytest.raises(NotFoundError):
        await store.overrides_remove(other.id, made.id, now=T0)
    with pytest.raises(NotFoundError):  # named under a run it is not bound to
        await store.overrides_remove(tenant.id, made.id, run_id=run.id, now=T0)
    await store.overrides_remove(tenant.id, made.id, job_id=job.id, now=T0)
    with pytest.raises(ConflictError, match="removed"):
        await store.overrides_remove(tenant.id, made.id, job_id=job.id, now=T0)

    await store.jobs_cancel(tenant.id, job.id, now=at(1))
    with pytest.raises(IllegalTransitionError, match="cancelled"):
        await override(store, job, OverrideScope.FUTURE, timeout=80.0)
    with pytest.raises(IllegalTransitionError, match="cancelled"):
        await override(store, job, OverrideScope.NEXT, timeout=80.0)


async def test_the_history_and_the_audit_trail_say_who_changed_what(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await minutely(store, tenant.id)
    made, _ = await store.overrides_create(
        tenant.id,
        scope=OverrideScope.NEXT,
        job_id=job.id,
        payload={"secret": "s3cr3t"},
        reason="hotfix",
        actor=BOB,
        now=T0,
    )
    events = await events_of(store, tenant.id, run_id=run.id)
    [added] = [e for e in events if e.kind == "override.added"]
    [overridden] = [e for e in events if e.kind == "run.overridden"]
    assert (added.actor, added.reason) == ("k-bob", "hotfix")
    assert added.data is not None and added.data["payload_keys"] == ["secret"]
    assert overridden.data == {"added": str(made.id)}
    page = await store.audit_list(tenant.id, action="override.add")
    [record] = page.items
    assert (record.key_id, record.reason, record.target_kind) == (BOB.key_id, "hotfix", "job")
    assert record.after is not None and record.after["runs"] == [str(run.id)]
    assert "s3cr3t" not in repr(record) + repr(added)


async def test_deleting_the_job_deletes_its_overrides(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await minutely(store, tenant.id)
    await override(store, job, OverrideScope.FUTURE, timeout=80.0)
    await override(store, job, OverrideScope.NEXT, timeout=70.0)
    await store.jobs_delete(tenant.id, job.id, force=True, now=at(1))
    async with engine_of(store).connect() as conn:
        left = (await conn.execute(sa.select(sa.func.count()).select_from(overrides))).scalar()
    assert left == 0
