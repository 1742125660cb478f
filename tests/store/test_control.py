"""Control of a job outside its schedule: pause, resume, trigger and backfill."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import IllegalTransitionError, NotFoundError, ValidationError
from cronwheel.domain.model import Job, Run
from cronwheel.domain.sharding import shard_of
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import CHANNEL_RUNS_NEW, CompleteItem, FailItem, RunFilter, Store
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.timing import local_form, occurrences

from .helpers import (
    ALL_SHARDS,
    T0,
    at,
    create_job,
    events_of,
    fire,
    job_spec,
    make_tenant,
    new_job,
    register_worker,
    transitions_of,
)

HOURLY_NY = {"cron": "0 * * * *", "timezone": "America/New_York"}


async def recurring_job(
    store: Store,
    tenant_id: uuid.UUID,
    *,
    schedule: dict[str, Any] | None = None,
    due_at: datetime = T0,
    **fields: Any,
) -> tuple[Job, Run]:
    spec = job_spec(schedule=schedule or HOURLY_NY, **fields)
    [(job, run, created)] = await store.jobs_create_many(
        tenant_id, jobs=[new_job(spec, due_at=due_at)], now=T0
    )
    assert created and run is not None and run.origin == "schedule"
    return job, run


async def job_runs(store: Store, tenant_id: uuid.UUID, job_id: uuid.UUID) -> dict[uuid.UUID, Run]:
    page = await store.runs_list(tenant_id, filter=RunFilter(job_id=job_id), limit=1000)
    return {r.id: r for r in page.items}


# -- pause ---------------------------------------------------------------------------


async def test_pause_parks_pending_runs_and_leaves_running_ones(store: Store) -> None:
    tenant = await make_tenant(store)
    job, later = await recurring_job(store, tenant.id, due_at=at(3600))
    # Three more runs of the same job: one RUNNING, one SUCCESS, one DISPATCHED.
    running = await store.jobs_trigger(tenant.id, job.id, now=T0)
    done = await store.jobs_trigger(tenant.id, job.id, now=at(1))
    assert len(await fire(store, [running, done], now=at(1))) == 2
    worker = await register_worker(store, tenant.id)
    leased = await store.attempts_lease(worker=worker, max=2, now=at(1))
    assert {a.run_id for a in leased} == {running.id, done.id}
    finishing = next(a for a in leased if a.run_id == done.id)
    [ok] = await store.attempts_complete_many(
        items=[CompleteItem(finishing.attempt_id, finishing.fencing_token)], now=at(2)
    )
    assert ok.ok
    dispatched = await store.jobs_trigger(tenant.id, job.id, now=at(2))
    assert len(await fire(store, [dispatched], now=at(2))) == 1

    paused = await store.jobs_pause(
        tenant.id, job.id, actor=Actor("alice"), reason="maintenance", now=at(10)
    )
    assert (paused.state, paused.version, paused.updated_at) == (
        JobState.PAUSED,
        job.version + 1,
        at(10),
    )
    assert await store.jobs_get(tenant.id, job.id) == paused

    runs = await job_runs(store, tenant.id, job.id)
    for run_id in (later.id, dispatched.id):
        run = runs[run_id]
        assert (run.state, run.fire_at, run.reason) == (
            RunState.SCHEDULED,
            PARKED_FIRE_AT,
            "job paused",
        )
        assert run.dispatched_at is None
    assert runs[later.id].due_at == at(3600)  # the due instant is kept
    assert runs[running.id].state is RunState.RUNNING
    assert runs[done.id].state is RunState.SUCCESS

    assert (await transitions_of(store, tenant.id, dispatched.id))[-1] == (
        "DISPATCHED",
        "SCHEDULED",
    )
    parked = [e for e in await events_of(store, tenant.id, run_id=later.id)][-1]
    assert (parked.kind, parked.actor, parked.reason, parked.at) == (
        "run.parked",
        "alice",
        "job paused",
        at(10),
    )
    job_events = [
        e
        for e in (await store.events_list(tenant.id, job_id=job.id, limit=1000)).items
        if e.kind == "job.paused"
    ]
    assert [(e.actor, e.reason) for e in job_events] == [("alice", "maintenance")]


async def test_a_paused_job_fires_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, due_at=T0)
    await store.jobs_pause(tenant.id, job.id, now=T0)

    far = at(365 * 86400)
    scanned = await store.runs_due_scan(shards=ALL_SHARDS, until=far)
    assert run.id not in {d.id for d in scanned}
    # A node that still held the run in its window cannot fire it either.
    assert await fire(store, [run], now=far) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED


async def test_pause_refuses_a_job_that_is_not_active(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await recurring_job(store, tenant.id)
    await store.jobs_pause(tenant.id, job.id, now=T0)
    snapshot = await job_runs(store, tenant.id, job.id)
    with pytest.raises(IllegalTransitionError) as info:
        await store.jobs_pause(tenant.id, job.id, now=at(1))
    assert "paused" in info.value.message
    assert (await store.jobs_get(tenant.id, job.id)).version == job.version + 1
    assert await job_runs(store, tenant.id, job.id) == snapshot

    cancelled, _ = await recurring_job(store, tenant.id)
    await store.jobs_cancel(tenant.id, cancelled.id, now=T0)
    with pytest.raises(IllegalTransitionError):
        await store.jobs_pause(tenant.id, cancelled.id, now=at(1))


async def test_control_never_reaches_another_tenant(store: Store) -> None:
    owner = await make_tenant(store)
    other = await make_tenant(store)
    job, run = await recurring_job(store, owner.id)
    past = (at(-7200), at(-1))
    for call in (
        store.jobs_pause(other.id, job.id, now=T0),
        store.jobs_resume(other.id, job.id, now=T0),
        store.jobs_trigger(other.id, job.id, now=T0),
        store.jobs_backfill(other.id, job.id, start=past[0], end=past[1], now=T0),
        store.jobs_pause(owner.id, uuid.uuid4(), now=T0),
    ):
        with pytest.raises(NotFoundError):
            await call
    assert (await store.jobs_get(owner.id, job.id)).state is JobState.ACTIVE
    assert list(await job_runs(store, owner.id, job.id)) == [run.id]


# -- resume --------------------------------------------------------------------------


async def test_resume_makes_parked_runs_due_again(store: Store) -> None:
    tenant = await make_tenant(store)
    job, missed = await recurring_job(store, tenant.id, due_at=at(60))
    paused = await store.jobs_pause(tenant.id, job.id, now=T0)
    triggered = await store.jobs_trigger(tenant.id, job.id, now=at(1))

    resumed = await store.jobs_resume(tenant.id, job.id, actor=Actor("bob"), now=at(600))
    assert (resumed.state, resumed.version) == (JobState.ACTIVE, paused.version + 1)
    run = await store.runs_get(tenant.id, missed.id)
    assert (run.state, run.fire_at, run.due_at, run.reason) == (
        RunState.SCHEDULED,
        at(60),
        at(60),
        "resumed after pause",
    )
    # The triggered run was never parked: the resume leaves it as it was.
    assert await store.runs_get(tenant.id, triggered.id) == triggered
    last = (await events_of(store, tenant.id, run_id=missed.id))[-1]
    assert (last.kind, last.actor, last.reason) == ("run.unparked", "bob", "resumed after pause")

    # Its due instant has passed: the scheduler fires it at once.
    assert [f.id for f in await fire(store, [run], now=at(600))] == [run.id]


async def test_resume_refuses_a_job_that_is_not_paused(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id)
    with pytest.raises(IllegalTransitionError) as info:
        await store.jobs_resume(tenant.id, job.id, now=T0)
    assert info.value.details["source"] == "active"
    assert await store.jobs_get(tenant.id, job.id) == job
    assert await store.runs_get(tenant.id, run.id) == run


async def test_resume_announces_runs_due_soon(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, due_at=T0)
    _far_job, far = await recurring_job(store, tenant.id, due_at=at(86400))
    await store.jobs_pause(tenant.id, _far_job.id, now=T0)
    expected = f"{run.shard}:{int(T0.timestamp() * 1000)}:{run.id.hex}"

    sub = store.subscribe(CHANNEL_RUNS_NEW)
    heard: list[str] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        # On PostgreSQL the LISTEN connection comes up in the background: a notice sent
        # before it is rightly lost, so pause and resume until one is heard.
        while expected not in heard and loop.time() < deadline:
            await store.jobs_pause(tenant.id, job.id, now=T0)
            await store.jobs_resume(tenant.id, job.id, now=T0)
            heard += await sub.wait(0.5)
        await store.jobs_resume(tenant.id, _far_job.id, now=T0)
        heard += await sub.wait(0.2)
    finally:
        sub.close()
    assert expected in heard
    assert not [p for p in heard if p.endswith(far.id.hex)]  # a day away: no hurry


# -- trigger -------------------------------------------------------------------------


async def test_trigger_makes_a_run_due_now_with_merged_payload(store: Store) -> None:
    tenant = await make_tenant(store)
    job, scheduled = await recurring_job(
        store, tenant.id, due_at=at(3600), payload={"region": "us", "n": 1}, pool="reports"
    )
    run = await store.jobs_trigger(
        tenant.id, job.id, actor=Actor("carol"), payload={"n": 2, "extra": True}, now=at(5)
    )
    assert (run.origin, run.state, run.due_at, run.fire_at, run.job_name) == (
        "trigger",
        RunState.SCHEDULED,
        at(5),
        at(5),
        job.name,
    )
    assert run.payload == {"region": "us", "n": 2, "extra": True}
    assert (run.shard, run.pool) == (shard_of(tenant.id, job.id), "reports")
    assert run.due_local == local_form(at(5), "America/New_York")
    assert run.due_local is not None and run.due_local.endswith("-05:00")
    assert await store.runs_get(tenant.id, run.id) == run
    # The job and its scheduled run are as they were.
    assert await store.jobs_get(tenant.id, job.id) == job
    assert await store.runs_get(tenant.id, scheduled.id) == scheduled
    assert await transitions_of(store, tenant.id, run.id) == [(None, "SCHEDULED")]
    kinds = [e.kind for e in (await store.events_list(tenant.id, job_id=job.id)).items]
    assert kinds.count("job.triggered") == 1

    assert [f.id for f in await fire(store, [run], now=at(5))] == [run.id]


async def test_triggers_in_the_same_microsecond_do_not_collide(store: Store) -> None:
    tenant = await make_tenant(store)
    job, scheduled = await recurring_job(store, tenant.id, due_at=T0)
    # Both land on the instant the scheduled run is due, too.
    runs = [await store.jobs_trigger(tenant.id, job.id, now=T0) for _ in range(3)]
    assert len({r.id for r in runs}) == 3
    due = sorted([scheduled.due_at, *(r.due_at for r in runs)])
    assert due == [T0 + timedelta(microseconds=i) for i in range(4)]


async def test_trigger_of_paused_finished_and_cancelled_jobs(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await recurring_job(store, tenant.id)
    await store.jobs_pause(tenant.id, job.id, now=T0)
    run = await store.jobs_trigger(tenant.id, job.id, now=at(1))
    assert run.fire_at == at(1)  # an explicit request: not parked by the pause

    # A one-off job that has finished can run again.
    one_off, first = await create_job(store, tenant.id, due_at=T0)
    assert len(await fire(store, [first], now=T0)) == 1
    worker = await register_worker(store, tenant.id)
    [attempt] = await store.attempts_lease(worker=worker, max=1, now=T0)
    await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=T0
    )
    assert (await store.jobs_get(tenant.id, one_off.id)).state is JobState.FINISHED
    again = await store.jobs_trigger(tenant.id, one_off.id, now=at(2))
    assert (again.origin, again.state) == ("trigger", RunState.SCHEDULED)
    assert again.due_local is not None and again.due_local.endswith("+00:00")

    await store.jobs_cancel(tenant.id, job.id, now=at(3))
    before = await job_runs(store, tenant.id, job.id)
    with pytest.raises(IllegalTransitionError):
        await store.jobs_trigger(tenant.id, job.id, now=at(4))
    assert await job_runs(store, tenant.id, job.id) == before


async def test_a_triggered_run_ending_does_not_finish_a_one_off_job(store: Store) -> None:
    # A one-off job due in an hour, triggered now: its triggered run ends (a success,
    # then another a failure) while its own run waits for its instant. The job stays
    # active (it can still be paused); its own run ending finishes it.
    tenant = await make_tenant(store)
    job, own = await create_job(store, tenant.id, due_at=at(3600))
    worker = await register_worker(store, tenant.id)
    for k, ok in enumerate((True, False)):
        triggered = await store.jobs_trigger(tenant.id, job.id, now=at(k))
        assert len(await fire(store, [triggered], now=at(k))) == 1
        [attempt] = await store.attempts_lease(worker=worker, max=1, now=at(k))
        assert attempt.run_id == triggered.id
        if ok:
            await store.attempts_complete_many(
                items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(k)
            )
        else:
            await store.attempts_fail_many(
                items=[FailItem(attempt.attempt_id, attempt.fencing_token, "boom", False)],
                now=at(k),
            )
        assert (await store.jobs_get(tenant.id, job.id)).state is JobState.ACTIVE
    assert (await store.runs_get(tenant.id, own.id)).state is RunState.SCHEDULED
    assert (await store.jobs_pause(tenant.id, job.id, now=at(10))).state is JobState.PAUSED
    await store.jobs_resume(tenant.id, job.id, now=at(11))
    assert len(await fire(store, [own], now=at(3600))) == 1
    [attempt] = await store.attempts_lease(worker=worker, max=1, now=at(3600))
    await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(3600)
    )
    assert (await store.jobs_get(tenant.id, job.id)).state is JobState.FINISHED


async def test_an_attempts_second_outcome_in_one_batch_is_refused(store: Store) -> None:
    # Two completions of one attempt in a batch, then two failures of another: the
    # first of each applies, the second is a repetition (stale), where both were
    # answered ok and the first completion's result, or failure, was lost.
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    _job, run = await create_job(store, tenant.id, due_at=T0)
    _job2, run2 = await create_job(store, tenant.id, due_at=T0)
    assert len(await fire(store, [run, run2], now=T0)) == 2
    a, b = await store.attempts_lease(worker=worker, max=2, now=T0)
    done = await store.attempts_complete_many(
        items=[
            CompleteItem(a.attempt_id, a.fencing_token, {"rows": 1}),
            CompleteItem(a.attempt_id, a.fencing_token, {"rows": 2}),
        ],
        now=at(1),
    )
    assert [(o.ok, o.error_code) for o in done] == [(True, None), (False, "stale_fencing_token")]
    assert (await store.runs_get(tenant.id, a.run_id)).result == {"rows": 1}
    failed = await store.attempts_fail_many(
        items=[
            FailItem(b.attempt_id, b.fencing_token, "first", False),
            FailItem(b.attempt_id, b.fencing_token, "second", False),
        ],
        now=at(2),
    )
    assert [(o.ok, o.error_code) for o in failed] == [(True, None), (False, "stale_fencing_token")]
    [attempt] = await store.attempts_list(tenant.id, run_id=b.run_id)
    assert attempt.error == "first"


# -- backfill ------------------------------------------------------------------------


async def test_backfill_creates_the_past_occurrences_once(store: Store) -> None:
    tenant = await make_tenant(store)
    job, scheduled = await recurring_job(store, tenant.id, due_at=at(3600))
    start, end = at(-5 * 3600 - 60), at(-3600)  # 4 whole hours: -5h … -2h
    runs = await store.jobs_backfill(
        tenant.id, job.id, start=start, end=end, actor=Actor("dave"), rate=2.0, now=T0
    )
    expected = occurrences("0 * * * *", "America/New_York", start, end)
    assert [r.due_at for r in runs] == expected and len(expected) == 4
    assert all(r.origin == "backfill" and r.state is RunState.SCHEDULED for r in runs)
    assert [r.fire_at for r in runs] == [at(i / 2.0) for i in range(4)]  # 2 per second
    assert [r.due_local for r in runs] == [local_form(d, "America/New_York") for d in expected]
    assert all(r.shard == scheduled.shard for r in runs)
    assert await transitions_of(store, tenant.id, runs[0].id) == [(None, "SCHEDULED")]
    [event] = [
        e
        for e in (await store.events_list(tenant.id, job_id=job.id, limit=1000)).items
        if e.kind == "job.backfilled"
    ]
    assert (event.actor, event.data["created"], event.data["occurrences"]) == ("dave", 4, 4)

    # Idempotent: the same range again creates nothing; a wider one only what is new.
    assert await store.jobs_backfill(tenant.id, job.id, start=start, end=end, now=at(10)) == []
    wider = await store.jobs_backfill(tenant.id, job.id, start=start, end=at(0), now=at(10))
    assert [r.due_at for r in wider] == [at(-3600)]
    all_runs = await job_runs(store, tenant.id, job.id)
    due = sorted(r.due_at for r in all_runs.values())
    assert len(due) == len(set(due))


async def test_backfill_honours_the_dst_policies(store: Store) -> None:
    tenant = await make_tenant(store)
    schedule = {"cron": "30 1 * * *", "timezone": "America/New_York", "on_ambiguous": "all"}
    job, _ = await recurring_job(store, tenant.id, schedule=schedule)
    # Fall back in New York, 2030-11-03: 01:30 happens twice.
    start = datetime(2030, 11, 2, tzinfo=UTC)
    end = datetime(2030, 11, 4, tzinfo=UTC)
    runs = await store.jobs_backfill(tenant.id, job.id, start=start, end=end, now=T0)
    assert [r.due_at for r in runs] == occurrences(
        "30 1 * * *", "America/New_York", start, end, on_ambiguous="all"
    )
    assert [r.due_local for r in runs] == [
        "2030-11-02T01:30:00-04:00",
        "2030-11-03T01:30:00-04:00",
        "2030-11-03T01:30:00-05:00",
    ]


async def test_backfill_of_an_interval_job(store: Store) -> None:
    tenant = await make_tenant(store)
    start_at = datetime(2031, 1, 1, tzinfo=UTC)
    job, _ = await recurring_job(
        store, tenant.id, schedule={"interval": 600, "start": start_at.isoformat()}
    )
    runs = await store.jobs_backfill(
        tenant.id, job.id, start=start_at, end=start_at + timedelta(hours=1), now=T0
    )
    assert [r.due_at for r in runs] == [start_at + timedelta(minutes=10 * i) for i in range(6)]
    assert all(r.due_local is None for r in runs)


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [
        (at(-60), at(-120), "to"),
        (at(-60), at(-60), "to"),
        (at(-60), at(60), "to"),
        (at(60), at(120), "from"),
        (datetime(2031, 1, 1), at(-1), "from"),  # naive
    ],
)
async def test_backfill_refuses_a_bad_range(
    store: Store, start: datetime, end: datetime, field: str
) -> None:
    tenant = await make_tenant(store)
    job, _ = await recurring_job(store, tenant.id)
    before = await job_runs(store, tenant.id, job.id)
    with pytest.raises(ValidationError) as info:
        await store.jobs_backfill(tenant.id, job.id, start=start, end=end, now=T0)
    assert info.value.field == field
    assert await job_runs(store, tenant.id, job.id) == before


async def test_backfill_refuses_one_off_cancelled_and_oversized(store: Store) -> None:
    tenant = await make_tenant(store)
    one_off, _ = await create_job(store, tenant.id)
    with pytest.raises(ValidationError) as info:
        await store.jobs_backfill(tenant.id, one_off.id, start=at(-600), end=at(-1), now=T0)
    assert info.value.field == "schedule"

    job, _ = await recurring_job(store, tenant.id, schedule={"cron": "* * * * *"})
    before = await job_runs(store, tenant.id, job.id)
    with pytest.raises(ValidationError) as info:
        await store.jobs_backfill(tenant.id, job.id, start=at(-3600), end=at(-1), limit=30, now=T0)
    assert info.value.field == "to" and "30" in info.value.message
    assert await job_runs(store, tenant.id, job.id) == before

    await store.jobs_cancel(tenant.id, job.id, now=T0)
    with pytest.raises(IllegalTransitionError):
        await store.jobs_backfill(tenant.id, job.id, start=at(-600), end=at(-1), now=T0)


async def test_a_large_backfill_is_written_in_batches(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _ = await recurring_job(store, tenant.id, schedule={"cron": "* * * * *"})
    start = at(-1500 * 60)
    runs = await store.jobs_backfill(tenant.id, job.id, start=start, end=at(0), rate=1000.0, now=T0)
    assert len(runs) == 1500
    assert runs[0].due_at == start and runs[-1].due_at == at(-60)
    assert runs[-1].fire_at == at(1499 / 1000)
    # A paused job can be backfilled too; its backfilled runs are not parked.
    await store.jobs_pause(tenant.id, job.id, now=T0)
    more = await store.jobs_backfill(
        tenant.id, job.id, start=at(-1600 * 60), end=at(0), rate=1000.0, now=at(1)
    )
    assert len(more) == 100 and all(r.fire_at < PARKED_FIRE_AT for r in more)


async def test_pause_and_resume_answer_the_job_as_jobs_get_does(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await recurring_job(store, tenant.id, due_at=at(3600))
    await store.runs_cancel(tenant.id, run.id, now=T0)  # nothing pending any more
    paused = await store.jobs_pause(tenant.id, job.id, now=at(1))
    assert paused == await store.jobs_get(tenant.id, job.id)
    assert paused.next_due_at is None
    resumed = await store.jobs_resume(tenant.id, job.id, now=at(2))
    assert resumed == await store.jobs_get(tenant.id, job.id)
    assert (resumed.state, resumed.version) == (JobState.ACTIVE, job.version + 2)
