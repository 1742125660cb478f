"""Editing a job (``jobs_update``): the new definition, conditional on the version it
was made from, and the rule for its runs — the pending occurrence moved or rewritten
in place, everything dispatched left as it was dispatched."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import (
    ConflictError,
    IllegalTransitionError,
    NotFoundError,
    StaleVersionError,
)
from cronwheel.domain.job_edit import JobEdit, job_edit, patched, spec_json
from cronwheel.domain.model import Job, NewJob, Run
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.spec import JobSpec
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import CHANNEL_RUNS_NEW, CompleteItem, RunFilter, Store, create_store
from cronwheel.store.schema import PARKED_FIRE_AT, runs
from cronwheel.store.sql.edits import EDITED_REASON
from cronwheel.timing import first_due, local_form
from cronwheel.timing.spread import spread_instant

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
    transitions_of,
)

ALICE = Actor("k-alice", role="operator", key_id=uuid.uuid4(), request_id="req-1")
LIMITS = JobLimits(max_horizon=timedelta(days=3650), past_grace=timedelta(seconds=60))
NY = "America/New_York"
HOURLY_NY = {"cron": "0 * * * *", "timezone": NY}


def edit_of(job: Job, *, now: datetime = T0, **patch: Any) -> JobEdit:
    """The edit ``patch`` makes of ``job`` at ``now``, as the API makes it."""
    spec = JobSpec.model_validate(patched(spec_json(job), patch))
    return job_edit(job, spec, now=now, limits=LIMITS)


async def edit(
    store: Store, job: Job, *, now: datetime = T0, reason: str | None = None, **patch: Any
) -> Job:
    """Edit the job as it is now."""
    current = await store.jobs_get(job.tenant_id, job.id)
    return await store.jobs_update(
        job.tenant_id,
        job.id,
        edit=edit_of(current, now=now, **patch),
        actor=ALICE,
        reason=reason,
        now=now,
    )


async def recurring_job(
    store: Store,
    tenant_id: uuid.UUID,
    *,
    schedule: dict[str, Any] | None = None,
    now: datetime = T0,
    **fields: Any,
) -> tuple[Job, Run]:
    """A recurring job created at ``now``, its first run due at its first occurrence."""
    spec = job_spec(schedule=schedule or HOURLY_NY, **fields)
    due = first_due(spec.schedule, now, max_horizon=LIMITS.max_horizon, past_grace=timedelta(0))
    [(job, run, _)] = await store.jobs_create_many(
        tenant_id, jobs=[NewJob(spec=spec, first_due_at=due)], now=now
    )
    assert run is not None and run.origin == "schedule"
    return job, run


async def job_runs(store: Store, job: Job) -> list[Run]:
    page = await store.runs_list(job.tenant_id, filter=RunFilter(job_id=job.id), limit=1000)
    return sorted(page.items, key=lambda r: r.due_at)


async def job_events(store: Store, job: Job, kind: str) -> list[Any]:
    page = await store.events_list(job.tenant_id, job_id=job.id, limit=1000)
    return [e for e in page.items if e.kind == kind and e.run_id is None]


# -- the definition --------------------------------------------------------------------


async def test_a_template_edit_rewrites_the_pending_run_in_place(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    edited = await edit(
        store,
        job,
        now=at(-300),
        reason="tuning",
        name="renamed",
        payload={"v": 2},
        pool="gpu",
        priority=0,
        tags=["x"],
        retry={"max_attempts": 7},
        timeout=60,
    )
    assert (edited.version, edited.updated_at, edited.state) == (2, at(-300), JobState.ACTIVE)
    assert (edited.name, edited.template.payload, edited.template.pool) == (
        "renamed",
        {"v": 2},
        "gpu",
    )
    assert edited.next_due_at == run.due_at == T0
    assert await store.jobs_get(tenant.id, job.id) == edited

    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.due_at, after.fire_at) == (RunState.SCHEDULED, T0, T0)
    assert (after.job_name, after.payload, after.pool, after.priority) == (
        "renamed",
        {"v": 2},
        "gpu",
        0,
    )
    assert (after.tags, after.max_attempts, after.timeout) == (["x"], 7, 60.0)
    assert after.retry["max_attempts"] == 7

    [edited_event] = await job_events(store, job, "job.edited")
    assert (edited_event.actor, edited_event.reason, edited_event.at) == (
        "k-alice",
        "tuning",
        at(-300),
    )
    data = edited_event.data
    changed = {"name", "payload", "pool", "priority", "tags", "retry", "timeout"}
    assert set(data["before"]) == set(data["after"]) == changed
    assert data["before"]["payload"] == {} and data["after"]["payload"] == {"v": 2}
    assert (data["before"]["priority"], data["after"]["priority"], data["version"]) == (2, 0, 2)
    last = (await events_of(store, tenant.id, run_id=run.id))[-1]
    assert (last.kind, last.actor, last.reason) == ("run.edited", "k-alice", EDITED_REASON)

    [record] = [r for r in (await store.audit_list(tenant.id)).items if r.action == "job.edit"]
    assert (record.target_id, record.reason, record.request_id) == (str(job.id), "tuning", "req-1")
    assert (record.before, record.after) == (data["before"], data["after"])


async def test_a_schedule_edit_moves_the_pending_run_to_the_new_next_occurrence(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    assert run.due_at == T0
    every_quarter = {"cron": "*/15 * * * *", "timezone": NY}
    edited = await edit(store, job, now=at(60), schedule=every_quarter)
    assert edited.next_due_at == at(900)  # the first occurrence from the edit on
    assert edited.schedule["cron"] == "*/15 * * * *" and edited.kind == "cron"

    moved = await store.runs_get(tenant.id, run.id)  # the same run
    assert (moved.state, moved.due_at, moved.fire_at, moved.origin) == (
        RunState.SCHEDULED,
        at(900),
        at(900),
        "schedule",
    )
    assert moved.due_local == local_form(at(900), NY)
    last = (await events_of(store, tenant.id, run_id=run.id))[-1]
    assert (last.kind, last.from_state, last.to_state, last.reason) == (
        "run.rescheduled",
        "SCHEDULED",
        "SCHEDULED",
        EDITED_REASON,
    )
    assert last.data == {
        "before": {"due_at": T0.isoformat(), "fire_at": T0.isoformat()},
        "after": {"due_at": at(900).isoformat(), "fire_at": at(900).isoformat()},
    }
    [data] = [e.data for e in await job_events(store, job, "job.edited")]
    assert data["before"] == {"schedule": {**job.schedule}}
    assert data["after"]["schedule"]["cron"] == "*/15 * * * *"

    # The chain goes on from the new schedule: firing it makes the one after.
    await fire(store, [moved], now=at(900))
    assert [(r.state, r.due_at) for r in await job_runs(store, job)] == [
        (RunState.DISPATCHED, at(900)),
        (RunState.SCHEDULED, at(1800)),
    ]


async def test_a_policy_edit_moves_no_run(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    before = await job_runs(store, job)
    edited = await edit(
        store, job, now=at(-60), schedule={**job.schedule, "catch_up": "skip", "overlap": "skip"}
    )
    assert edited.version == 2 and edited.schedule["catch_up"] == "skip"
    assert await job_runs(store, job) == before
    assert [e.kind for e in await events_of(store, tenant.id, run_id=run.id)] == ["run.transition"]


async def test_a_spread_edit_moves_only_the_fire_time(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, schedule={"interval": 3600}, now=at(-600))
    await edit(store, job, now=at(-60), spread=30)
    moved = await store.runs_get(tenant.id, run.id)
    assert moved.due_at == T0
    assert moved.fire_at == spread_instant(job.id, T0, 30) > T0


async def test_edits_back_and_forth_keep_one_run_and_the_chain_whole(store: Store) -> None:
    """A schedule changed and changed back leaves no finished run at an occurrence the
    job reaches again: its pending run is moved, never replaced."""
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    await edit(store, job, now=at(-300), schedule={"cron": "30 * * * *", "timezone": NY})
    assert (await store.runs_get(tenant.id, run.id)).due_at == at(-1800 + 3600)
    await edit(store, job, now=at(-200), schedule=HOURLY_NY)
    assert [(r.id, r.due_at) for r in await job_runs(store, job)] == [(run.id, T0)]
    await fire(store, [run], now=T0)
    assert [(r.state, r.due_at) for r in await job_runs(store, job)] == [
        (RunState.DISPATCHED, T0),
        (RunState.SCHEDULED, at(3600)),
    ]


async def test_a_one_off_jobs_instant_moves_its_run(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(
        store, tenant.id, due_at=at(600), schedule={"at": at(600).isoformat()}
    )
    kolkata = at(1200).astimezone(ZoneInfo("Asia/Kolkata")).isoformat()
    edited = await edit(store, job, schedule={"at": kolkata})
    moved = await store.runs_get(tenant.id, run.id)
    assert (moved.due_at, moved.fire_at, moved.origin) == (at(1200), at(1200), "once")
    assert moved.due_local == kolkata  # the instant as written, with its offset
    assert edited.next_due_at == at(1200)

    edited = await edit(store, job, now=at(10), schedule={"delay": 30})
    assert (edited.kind, edited.next_due_at) == ("delay", at(40))
    edited = await edit(store, job, now=at(20), schedule={"asap": True})
    assert (edited.kind, edited.next_due_at) == ("asap", at(20))
    assert [r.id for r in await job_runs(store, job)] == [run.id]
    assert [f.id for f in await fire(store, [moved], now=at(20))] == [run.id]


# -- the rule for runs already on their way -----------------------------------------------


async def test_dispatched_and_triggered_runs_keep_what_they_were_made_with(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    job, first = await recurring_job(
        store, tenant.id, schedule={"interval": 60}, payload={"v": 1}, now=at(-10)
    )
    await fire(store, [first], now=T0)
    triggered = await store.jobs_trigger(tenant.id, job.id, now=at(1))
    [_dispatched, pending] = [r for r in await job_runs(store, job) if r.origin == "schedule"]
    assert pending.state is RunState.SCHEDULED and pending.due_at == at(60)

    await edit(store, job, now=at(2), payload={"v": 2})
    assert (await store.runs_get(tenant.id, first.id)).payload == {"v": 1}
    assert (await store.runs_get(tenant.id, triggered.id)).payload == {"v": 1}
    assert (await store.runs_get(tenant.id, pending.id)).payload == {"v": 2}
    # What a worker leases is what the run was dispatched with.
    worker = await register_worker(store, tenant.id)
    [leased] = await store.attempts_lease(worker=worker, max=1, now=at(3))
    assert (leased.run_id, leased.payload) == (first.id, {"v": 1})

    # A schedule edit leaves them too, and moves the pending occurrence only.
    await edit(store, job, now=at(4), schedule={"interval": 30})
    assert (await store.runs_get(tenant.id, first.id)).state is RunState.RUNNING
    assert (await store.runs_get(tenant.id, pending.id)).due_at == at(30)


async def test_a_reserved_run_starts_as_it_was_reserved(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(
        store, tenant.id, schedule={"interval": 60}, payload={"v": 1}, now=at(-10)
    )
    await hold_all_shards(store, now=at(-3))
    assert [
        f.id for f in await store.runs_fire(run_ids=[run.id], node_id="node-a", now=at(-3), lead=5)
    ] == [run.id]
    worker = await register_worker(store, tenant.id)
    [reserved] = await store.attempts_lease(worker=worker, max=1, ahead=5, now=at(-2))
    assert reserved.not_before == T0

    await edit(store, job, now=at(-1), payload={"v": 2}, schedule={"interval": 30})
    kept = await store.runs_get(tenant.id, run.id)
    assert (kept.state, kept.payload, kept.due_at) == (RunState.DISPATCHED, {"v": 1}, T0)
    started = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=T0
    )
    assert started.started == [reserved.fencing_token]
    # The next occurrence firing made moved to the new schedule's first one after the
    # reserved run's instant, with the new template.
    pending = [r for r in await job_runs(store, job) if r.state is RunState.SCHEDULED]
    assert [(r.due_at, r.payload) for r in pending] == [(at(30), {"v": 2})]


async def test_a_one_off_job_whose_run_went_out_keeps_its_schedule(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(store, tenant.id, due_at=at(3), schedule={"at": at(3).isoformat()})
    await hold_all_shards(store)
    await store.runs_fire(run_ids=[run.id], node_id="node-a", now=T0, lead=5)
    worker = await register_worker(store, tenant.id)
    await store.attempts_lease(worker=worker, max=1, ahead=5, now=T0)  # reserved
    before = (await store.jobs_get(tenant.id, job.id), await job_runs(store, job))
    with pytest.raises(ConflictError) as info:
        await edit(store, job, now=at(1), schedule={"at": at(600).isoformat()})
    assert info.value.details == {"run_id": str(run.id), "run_state": "DISPATCHED"}
    assert info.value.field == "schedule"
    assert (await store.jobs_get(tenant.id, job.id), await job_runs(store, job)) == before
    # Its template may change: the job's; the run keeps what it was dispatched with.
    edited = await edit(store, job, now=at(1), payload={"late": True})
    assert edited.template.payload == {"late": True}
    assert (await store.runs_get(tenant.id, run.id)).payload == {}


async def test_a_paused_job_stays_paused_and_its_held_run_follows(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    await store.jobs_pause(tenant.id, job.id, now=at(-500))
    edited = await edit(
        store, job, now=at(-400), schedule={"cron": "50 * * * *", "timezone": NY}, pool="p2"
    )
    assert (edited.state, edited.version) == (JobState.PAUSED, 3)
    held = await store.runs_get(tenant.id, run.id)
    assert (held.state, held.due_at, held.fire_at, held.reason, held.pool) == (
        RunState.SCHEDULED,
        at(3000),
        PARKED_FIRE_AT,
        "job paused",
        "p2",
    )
    edited = await edit(store, job, now=at(-300), payload={"p": 1})
    assert (await store.runs_get(tenant.id, run.id)).payload == {"p": 1}
    await store.jobs_resume(tenant.id, job.id, now=at(-200))
    assert (await store.runs_get(tenant.id, run.id)).fire_at == at(3000)


async def test_an_occurrence_a_run_already_has_is_passed_over(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, schedule={"cron": "*/5 * * * *"}, now=at(-100))
    await hold_all_shards(store, now=at(-3))
    await store.runs_fire(run_ids=[run.id], node_id="node-a", now=at(-3), lead=5)
    [_, pending] = await job_runs(store, job)
    assert pending.due_at == at(300)
    # The new schedule's first occurrence, T0, is the dispatched run's: the next one is
    # the pending run's.
    await edit(store, job, now=at(-2), schedule={"cron": "*/10 * * * *"})
    assert [(r.id, r.state, r.due_at) for r in await job_runs(store, job)] == [
        (run.id, RunState.DISPATCHED, T0),
        (pending.id, RunState.SCHEDULED, at(600)),
    ]


async def test_other_pending_occurrences_end_skipped(store: Store) -> None:
    """Should a job hold two pending occurrences, the one the new schedule keeps is
    moved, the other is SKIPPED with the reason and the actor."""
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, schedule={"interval": 60}, now=at(-10))
    extra = uuid.uuid4()
    async with engine_of(store).begin() as conn:
        row = (await conn.execute(sa.select(runs).where(runs.c.id == run.id))).one()._asdict()
        await conn.execute(runs.insert().values({**row, "id": extra, "due_at": at(-60)}))
    await edit(store, job, now=at(10), schedule={"interval": 20})
    assert (await store.runs_get(tenant.id, run.id)).due_at == at(20)
    skipped = await store.runs_get(tenant.id, extra)
    assert (skipped.state, skipped.reason, skipped.finished_at) == (
        RunState.SKIPPED,
        EDITED_REASON,
        at(10),
    )
    last = (await events_of(store, tenant.id, run_id=extra))[-1]
    assert (last.from_state, last.to_state, last.actor) == ("SCHEDULED", "SKIPPED", "k-alice")


async def test_a_gap_before_the_new_first_occurrence_is_recorded(store: Store) -> None:
    now = datetime(2026, 3, 8, 5, 0, tzinfo=UTC)  # 00:00 EST; 02:30 does not exist today
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, schedule={"interval": 3600}, now=now)
    skip = {"cron": "30 2 * * *", "timezone": NY, "on_nonexistent": "skip"}
    await edit(store, job, now=now, schedule=skip)
    found = await job_runs(store, job)
    [gap] = [r for r in found if r.state is RunState.SKIPPED]
    assert gap.due_local == "2026-03-08T02:30:00" and gap.reason
    assert await transitions_of(store, tenant.id, gap.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "SKIPPED"),
    ]
    moved = await store.runs_get(tenant.id, run.id)
    assert moved.due_local == "2026-03-09T02:30:00-04:00"


async def test_a_move_into_the_near_future_is_announced(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(
        store, tenant.id, due_at=at(86400), schedule={"at": at(86400).isoformat()}
    )
    sub = store.subscribe(CHANNEL_RUNS_NEW)
    heard: list[str] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        # On PostgreSQL the LISTEN connection comes up in the background: edit until a
        # notice is heard.
        seconds = 10
        while not heard and loop.time() < deadline:
            seconds += 1
            await edit(store, job, schedule={"at": at(seconds).isoformat()})
            heard += await sub.wait(0.5)
    finally:
        sub.close()
    assert f"{run.shard}:{int(at(seconds).timestamp() * 1000)}:{run.id.hex}" in heard


# -- refusals ------------------------------------------------------------------------


async def test_an_edit_from_a_stale_version_changes_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await recurring_job(store, tenant.id, now=at(-600))
    stale = edit_of(job, payload={"v": 1})
    await store.jobs_pause(tenant.id, job.id, now=at(-500))
    before = (await store.jobs_get(tenant.id, job.id), await job_runs(store, job))
    with pytest.raises(StaleVersionError) as info:
        await store.jobs_update(tenant.id, job.id, edit=stale, actor=ALICE, now=at(-400))
    assert info.value.details == {"current_version": 2}
    assert info.value.status == 412
    assert (await store.jobs_get(tenant.id, job.id), await job_runs(store, job)) == before
    assert await job_events(store, job, "job.edited") == []


async def test_a_job_over_or_of_another_tenant_is_not_edited(store: Store) -> None:
    owner, other = await make_tenant(store), await make_tenant(store)
    job, _run = await recurring_job(store, owner.id, now=at(-600))
    change = edit_of(job, payload={"v": 1})
    for tenant_id, job_id in ((other.id, job.id), (owner.id, uuid.uuid4())):
        with pytest.raises(NotFoundError):
            await store.jobs_update(tenant_id, job_id, edit=change, now=T0)

    cancelled = await store.jobs_cancel(owner.id, job.id, now=at(-500))
    with pytest.raises(IllegalTransitionError) as info:
        await store.jobs_update(owner.id, job.id, edit=edit_of(cancelled, pool="x"), now=T0)
    assert "cancelled" in info.value.message

    one_off, run = await create_job(store, owner.id, due_at=T0)
    await fire(store, [run], now=T0)
    worker = await register_worker(store, owner.id)
    [attempt] = await store.attempts_lease(worker=worker, max=1, now=T0)
    await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(1)
    )
    finished = await store.jobs_get(owner.id, one_off.id)
    assert finished.state is JobState.FINISHED
    with pytest.raises(IllegalTransitionError):
        await store.jobs_update(owner.id, one_off.id, edit=edit_of(finished, pool="x"), now=T0)


async def test_two_edits_racing_from_one_version(store: Store, store_url: str) -> None:
    """Two edits made from the same version, each through its own connections at once:
    exactly one applies; the other is refused and changes nothing."""
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, now=at(-600))
    editors = [create_store(store_url) for _ in range(2)]
    for editor in editors:
        await editor.open()
    try:
        outcomes = await asyncio.gather(
            *(
                editor.jobs_update(
                    tenant.id, job.id, edit=edit_of(job, payload={"by": n}), actor=ALICE, now=T0
                )
                for n, editor in enumerate(editors)
            ),
            return_exceptions=True,
        )
    finally:
        for editor in editors:
            await editor.close()
    [won] = [o for o in outcomes if isinstance(o, Job)]
    [lost] = [o for o in outcomes if not isinstance(o, Job)]
    assert isinstance(lost, StaleVersionError), lost
    assert lost.details == {"current_version": 2}
    final = await store.jobs_get(tenant.id, job.id)
    assert final == won and final.version == 2
    assert (await store.runs_get(tenant.id, run.id)).payload == won.template.payload
    assert len(await job_events(store, job, "job.edited")) == 1
    assert (
        len([r for r in (await store.audit_list(tenant.id)).items if r.action == "job.edit"]) == 1
    )


async def test_webhook_header_values_are_never_recorded(store: Store) -> None:
    tenant = await make_tenant(store)
    hook = {"url": "https://example.com/a", "headers": {"Authorization": "Bearer old-secret"}}
    job, _run = await create_job(store, tenant.id, due_at=at(60), task=None, webhook=hook)
    new = {"url": "https://example.com/b", "headers": {"Authorization": "Bearer new-secret"}}
    edited = await edit(store, job, webhook=new)
    assert edited.template.webhook is not None
    assert edited.template.webhook["headers"] == {"Authorization": "Bearer new-secret"}
    [event] = await job_events(store, job, "job.edited")
    [record] = [r for r in (await store.audit_list(tenant.id)).items if r.action == "job.edit"]
    for kept in (event.data, record.before, record.after):
        assert "secret" not in str(kept)
    assert event.data["after"]["webhook"]["headers"] == {"Authorization": "[redacted]"}
    # Back to a task: the webhook capability goes with the webhook.
    edited = await edit(store, job, webhook=None, task="plain.task")
    assert (edited.template.task, edited.template.webhook, edited.template.requires) == (
        "plain.task",
        None,
        [],
    )
