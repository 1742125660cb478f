"""Recurring jobs through the scheduler: the next occurrence is materialised when one
fires, DST nights produce exactly the runs the time engine says, catch-up and overlap
policies decide what missed or overlapping runs do. Time is driven by hand."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.audit import Actor
from cronwheel.domain.model import NewJob, Run
from cronwheel.domain.spec import JobSpec
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import CompleteItem, RunFilter, Store
from cronwheel.store.schema import runs
from cronwheel.timing import due_local as local_of
from cronwheel.timing import first_due, occurrences

NODE = "node-r"
HORIZON = timedelta(days=3650)


async def _job(store: Store, now: datetime, schedule: dict[str, Any], name: str = "r") -> Run:
    tenant = await store.tenants_create(name=f"tenant-{name}", limits={}, now=now)
    spec = JobSpec.model_validate({"name": name, "schedule": schedule, "task": "noop"})
    due = first_due(spec.schedule, now, max_horizon=HORIZON, past_grace=timedelta(0))
    [(_job, run, _)] = await store.jobs_create_many(
        tenant.id,
        jobs=[NewJob(spec=spec, first_due_at=due, due_local=local_of(spec.schedule, due))],
        now=now,
    )
    assert run is not None and run.origin == "schedule"
    return run


async def _runs(store: Store, run: Run) -> list[Run]:
    page = await store.runs_list(run.tenant_id, filter=RunFilter(job_id=run.job_id), limit=1000)
    return sorted(page.items, key=lambda r: r.due_at)


async def _fire(store: Store, run: Run, now: datetime) -> list[Any]:
    await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=3600, now=now)
    return await store.runs_fire(run_ids=[run.id], node_id=NODE, now=now)


async def test_firing_materialises_the_next_occurrence_once(store: Store) -> None:
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "*/5 * * * *"})
    assert first.due_at == t0
    assert [f.id for f in await _fire(store, first, t0)] == [first.id]
    assert await _fire(store, first, t0) == []  # once
    runs = await _runs(store, first)
    assert [(r.state.value, r.due_at) for r in runs] == [
        ("DISPATCHED", t0),
        ("SCHEDULED", t0 + timedelta(minutes=5)),
    ]
    job = await store.jobs_get(first.tenant_id, first.job_id)
    assert job.next_due_at == t0 + timedelta(minutes=5)
    events = (await store.events_list(first.tenant_id, run_id=runs[1].id)).items
    assert [(e.from_state, e.to_state) for e in events] == [(None, "SCHEDULED")]


async def test_fall_back_night_produces_exactly_the_engines_runs(store: Store) -> None:
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    end = datetime(2026, 11, 1, 7, 30, tzinfo=UTC)  # 02:30 EST
    schedule = {"cron": "*/1 * * * *", "timezone": "America/New_York", "on_ambiguous": "all"}
    first = await _job(store, start, schedule)
    now = start

    def clock() -> datetime:
        return now

    node = SchedulerNode(
        store, Settings(window_seconds=30), node_id=NODE, clock=Clock(clock, offset=timedelta(0))
    )
    while now < end:  # a pass at each instant: the cron fires every minute of UTC time
        await node.run_once()
        now += timedelta(minutes=1)
    runs = [r for r in await _runs(store, first) if r.due_at < end]
    expected = occurrences("*/1 * * * *", "America/New_York", start, end, on_ambiguous="all")
    assert [r.due_at for r in runs] == expected
    assert all(r.state.value == "DISPATCHED" for r in runs)
    # 01:00-01:59 happen twice, each with its own offset: distinct runs.
    locals_ = [r.due_local for r in runs]
    assert "2026-11-01T01:30:00-04:00" in locals_ and "2026-11-01T01:30:00-05:00" in locals_
    assert len(runs) == 180  # one a minute of elapsed time: the repeated hour runs twice


async def test_spring_forward_skip_is_recorded(store: Store) -> None:
    start = datetime(2026, 3, 6, 12, 0, tzinfo=UTC)
    schedule = {"cron": "30 2 * * *", "timezone": "America/New_York", "on_nonexistent": "skip"}
    first = await _job(store, start, schedule)
    assert first.due_local == "2026-03-07T02:30:00-05:00"
    await _fire(store, first, first.due_at)
    runs = await _runs(store, first)
    skipped = [r for r in runs if r.state.value == "SKIPPED"]
    assert len(skipped) == 1 and skipped[0].due_local == "2026-03-08T02:30:00"
    assert "not exist" in (skipped[0].reason or "") or "skipped" in (skipped[0].reason or "")
    [scheduled] = [r for r in runs if r.state.value == "SCHEDULED"]
    assert scheduled.due_local == "2026-03-09T02:30:00-04:00"


async def test_a_gap_before_the_first_run_is_recorded_at_creation(store: Store) -> None:
    """Created just before a spring-forward night, a job whose first wall time falls in
    the gap records it SKIPPED with the job; its first run is the next day's."""
    from cronwheel.api.routers.jobs import _new_job

    now = datetime(2026, 3, 8, 5, 0, tzinfo=UTC)  # 00:00 EST; 02:30 does not exist today
    schedule = {"cron": "30 2 * * *", "timezone": "America/New_York", "on_nonexistent": "skip"}
    tenant = await store.tenants_create(name="gap-first", limits={}, now=now)
    spec = JobSpec.model_validate({"name": "g", "schedule": schedule, "task": "noop"})
    settings = Settings(max_horizon_days=3650, past_grace_seconds=0)
    [(job, run, created)] = await store.jobs_create_many(
        tenant.id, jobs=[_new_job(settings.job_limits, spec, now, actor=Actor("tester"))], now=now
    )
    assert created and run is not None
    assert run.state.value == "SCHEDULED" and run.due_local == "2026-03-09T02:30:00-04:00"
    assert job.next_due_at == run.due_at
    runs = await _runs(store, run)
    assert [(r.state.value, r.due_local) for r in runs] == [
        ("SKIPPED", "2026-03-08T02:30:00"),
        ("SCHEDULED", "2026-03-09T02:30:00-04:00"),
    ]
    skipped = runs[0]
    assert skipped.finished_at == now and "not exist" in (skipped.reason or "")
    events = (await store.events_list(tenant.id, run_id=skipped.id)).items
    assert [(e.from_state, e.to_state) for e in events] == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "SKIPPED"),
    ]
    # Firing the first run does not record the gap a second time.
    await _fire(store, run, run.due_at)
    again = await _runs(store, run)
    assert [r.due_local for r in again if r.state.value == "SKIPPED"] == ["2026-03-08T02:30:00"]


async def test_catch_up_coalesce_fires_one_run_for_all_missed(store: Store) -> None:
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "0 * * * *", "catch_up": "coalesce"})
    late = t0 + timedelta(hours=3, minutes=10)
    assert len(await _fire(store, first, late)) == 1
    runs = await _runs(store, first)
    assert [(r.state.value, r.due_at) for r in runs] == [
        ("DISPATCHED", t0),
        ("SCHEDULED", t0 + timedelta(hours=4)),
    ]
    assert "stands for 4 missed occurrences" in (runs[0].reason or "")


async def test_catch_up_replay_runs_missed_ones_within_the_window(store: Store) -> None:
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    schedule = {"cron": "0 * * * *", "catch_up": "replay", "catch_up_window": 2.5 * 3600}
    first = await _job(store, t0, schedule)
    late = t0 + timedelta(hours=3, minutes=10)
    await _fire(store, first, late)
    states = [(r.state.value, r.due_at - t0, r.origin) for r in await _runs(store, first)]
    assert states == [
        ("SKIPPED", timedelta(hours=0), "schedule"),  # older than the window
        ("DISPATCHED", timedelta(hours=1), "replay"),
        ("DISPATCHED", timedelta(hours=2), "replay"),
        ("DISPATCHED", timedelta(hours=3), "replay"),
        ("SCHEDULED", timedelta(hours=4), "schedule"),
    ]


async def test_catch_up_skip_records_every_missed_run(store: Store) -> None:
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"interval": 3600, "start": t0.isoformat(), "catch_up": "skip"})
    await _fire(store, first, t0 + timedelta(hours=2, minutes=30))
    runs = await _runs(store, first)
    assert [r.state.value for r in runs] == ["SKIPPED", "SKIPPED", "SKIPPED", "SCHEDULED"]
    assert all("catch_up=skip" in (r.reason or "") for r in runs[:3])
    assert runs[-1].due_at == t0 + timedelta(hours=3)


async def test_overlap_skip_skips_while_the_previous_run_is_going(store: Store) -> None:
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "*/5 * * * *", "overlap": "skip"})
    await _fire(store, first, t0)
    worker = await store.workers_register(
        None, pool="default", capabilities=[], tags=[], capacity=1, now=t0
    )
    assert len(await store.attempts_lease(worker=worker, max=1, now=t0)) == 1
    second = (await _runs(store, first))[1]
    assert await _fire(store, second, second.due_at) == []
    runs = await _runs(store, first)
    assert [r.state.value for r in runs] == ["RUNNING", "SKIPPED", "SCHEDULED"]
    assert "overlap=skip" in (runs[1].reason or "")


async def test_overlap_queue_one_queues_one_run_behind_the_running_one(store: Store) -> None:
    """The queued run is marked by its own column, not by its reason's text: a reason
    rewritten (by a pause, a person, a later version) changes nothing."""
    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "*/5 * * * *", "overlap": "queue_one"})
    await _fire(store, first, t0)
    worker = await store.workers_register(
        None, pool="default", capabilities=[], tags=[], capacity=1, now=t0
    )
    [attempt] = await store.attempts_lease(worker=worker, max=1, now=t0)
    second = (await _runs(store, first))[1]
    assert await _fire(store, second, second.due_at) == []  # it waits
    queued = (await _runs(store, first))[1]
    assert (queued.state.value, queued.reason) == (
        "SCHEDULED",
        "queued behind the run still going (overlap=queue_one)",
    )
    async with store.engine.begin() as conn:  # type: ignore[attr-defined]
        marked = await conn.execute(
            sa.select(runs.c.id).where(runs.c.job_id == first.job_id, runs.c.overlap_queued)
        )
        assert [r.id for r in marked] == [second.id]
        await conn.execute(
            runs.update().where(runs.c.id == second.id).values(reason="edited by hand")
        )
        # Another occurrence due meanwhile (as a replay after an outage makes them).
        row = dict((await conn.execute(runs.select().where(runs.c.id == second.id))).one()._mapping)
        third_due = second.due_at + timedelta(minutes=5)
        third_id = uuid.uuid4()
        row |= {
            "id": third_id,
            "due_at": third_due,
            "fire_at": third_due,
            "due_local": None,
            "reason": None,
            "overlap_queued": False,
        }
        await conn.execute(runs.insert().values(**row))
    third = await store.runs_get(first.tenant_id, third_id)
    assert await _fire(store, third, third.due_at) == []
    states = [(r.state.value, r.reason) for r in await _runs(store, first)]
    assert states[:3] == [
        ("RUNNING", None),
        ("SCHEDULED", "edited by hand"),
        ("SKIPPED", "a run is already queued behind the one still going (overlap=queue_one)"),
    ]
    # The running one ends: the queued one goes, and is no longer marked.
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=third.due_at
    )
    assert done.ok
    later = third.due_at + timedelta(seconds=2)
    assert [f.id for f in await _fire(store, second, later)] == [second.id]
    async with store.engine.begin() as conn:  # type: ignore[attr-defined]
        left = await conn.execute(
            sa.select(runs.c.id).where(runs.c.job_id == first.job_id, runs.c.overlap_queued)
        )
        assert list(left) == []


async def test_coalesce_after_a_long_outage_dispatches_one_run(store: Store) -> None:
    t0 = datetime(2031, 3, 4, 0, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "* * * * *", "catch_up": "coalesce"})
    late = t0 + timedelta(hours=36)
    await _fire(store, first, late)
    runs = await _runs(store, first)
    assert [r.state.value for r in runs] == ["DISPATCHED", "SCHEDULED"]
    assert "stands for 2161 missed occurrences" in (runs[0].reason or "")
    assert runs[1].due_at == late + timedelta(minutes=1)


async def test_dst_gap_during_an_outage_is_recorded(store: Store) -> None:
    start = datetime(2031, 3, 7, 12, 0, tzinfo=UTC)
    schedule = {
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "on_nonexistent": "skip",
        "catch_up": "skip",
    }
    first = await _job(store, start, schedule)  # due 2031-03-08 02:30 EST
    await _fire(store, first, datetime(2031, 3, 10, 12, 0, tzinfo=UTC))  # down over the 9th
    runs = await _runs(store, first)
    assert [(r.state.value, r.due_local) for r in runs] == [
        ("SKIPPED", "2031-03-08T02:30:00-05:00"),
        ("SKIPPED", "2031-03-09T02:30:00"),  # the wall time that did not exist
        ("SKIPPED", "2031-03-10T02:30:00-04:00"),
        ("SCHEDULED", "2031-03-11T02:30:00-04:00"),
    ]


async def test_a_run_created_while_its_job_was_being_cancelled_is_settled(store: Store) -> None:
    """Firing and cancelling at once can leave the freshly created next occurrence behind
    (the cancel never saw it). When it comes due it is cancelled, not fired, and never
    comes back."""
    import sqlalchemy as sa

    from cronwheel.store.schema import jobs

    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "*/5 * * * *"})
    await _fire(store, first, t0)
    # The race's outcome: the job is cancelled, its next run still SCHEDULED.
    async with store.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            sa.update(jobs).where(jobs.c.id == first.job_id).values(state="cancelled")
        )
    nxt = (await _runs(store, first))[1]
    assert await _fire(store, nxt, nxt.due_at) == []
    runs = await _runs(store, first)
    assert [r.state.value for r in runs] == ["DISPATCHED", "CANCELLED"]
    assert runs[1].reason == "job cancelled"
    due = await store.runs_due_scan(shards=[first.shard], until=nxt.due_at + timedelta(days=1))
    assert due == []


async def test_a_retry_of_a_paused_job_waits_for_resume(store: Store) -> None:
    from cronwheel.store import FailItem
    from cronwheel.store.schema import PARKED_FIRE_AT

    t0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    first = await _job(store, t0, {"cron": "*/5 * * * *"})
    await _fire(store, first, t0)
    worker = await store.workers_register(
        None, pool="default", capabilities=[], tags=[], capacity=1, now=t0
    )
    [attempt] = await store.attempts_lease(worker=worker, max=1, now=t0)
    await store.jobs_pause(first.tenant_id, first.job_id, now=t0)
    await store.attempts_fail_many(
        items=[FailItem(attempt.attempt_id, attempt.fencing_token, "boom")], now=t0
    )
    run = await store.runs_get(first.tenant_id, first.id)
    assert run.state.value == "SCHEDULED" and run.fire_at == PARKED_FIRE_AT
    assert (run.reason or "").startswith("job paused")
    await store.jobs_resume(first.tenant_id, first.job_id, now=t0 + timedelta(minutes=1))
    run = await store.runs_get(first.tenant_id, first.id)
    assert run.fire_at < t0 + timedelta(minutes=2)
