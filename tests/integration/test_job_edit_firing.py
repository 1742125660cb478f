"""An edited job through a scheduler node that already holds its pending run in its due
window: the run fires at its new instant, not its old one, with the new template, and a
recurring job's chain goes on from the new schedule. Time is driven by hand; the
node hears the edit's notice as its loop would (or finds the run by its poll)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cronwheel.domain.audit import Actor
from cronwheel.domain.job_edit import job_edit, patched, spec_json
from cronwheel.domain.model import Job, NewJob, Run
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.spec import JobSpec
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import CHANNEL_RUNS_NEW, RunFilter, Store, Subscription
from cronwheel.store.notices import parse_announcement
from cronwheel.testing import wait_until_async

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LIMITS = JobLimits(max_horizon=timedelta(days=3650))


class FakeTime:
    def __init__(self, start: datetime) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def _job(store: Store, due: datetime, **spec: Any) -> tuple[Job, Run]:
    tenant = await store.tenants_create(name=f"t-{uuid.uuid4().hex[:6]}", limits={}, now=T0)
    body = {"name": "j", "schedule": {"at": due.isoformat()}, "task": "noop", **spec}
    [(job, run, _)] = await store.jobs_create_many(
        tenant.id,
        jobs=[NewJob(spec=JobSpec.model_validate(body), first_due_at=due)],
        now=T0,
    )
    assert run is not None
    return job, run


async def _edit(store: Store, job: Job, now: datetime, **patch: Any) -> Job:
    current = await store.jobs_get(job.tenant_id, job.id)
    spec = JobSpec.model_validate(patched(spec_json(current), patch))
    change = job_edit(current, spec, now=now, limits=LIMITS)
    return await store.jobs_update(
        job.tenant_id, job.id, edit=change, actor=Actor("tester"), now=now
    )


def _node(store: Store, time: FakeTime) -> SchedulerNode:
    settings = Settings(window_seconds=60, shard_lease_ttl=3600, dispatch_lead=0)
    return SchedulerNode(store, settings, node_id="node-e", clock=Clock(time, offset=timedelta(0)))


async def _hear(node: SchedulerNode, sub: Subscription, run: Run, fire_at: datetime) -> None:
    """What the node's loop does with the notices that came: absorb them (on
    PostgreSQL they come through LISTEN, a moment after the commit). The edit's notice
    is the one naming the run at its new instant: the creation's own notice, still in
    flight on the store's shared listener, can reach a subscription opened after it."""
    heard: list[str] = []

    async def arrived() -> bool:
        heard.extend(await sub.wait(0.1))
        return any((a.id, a.fire_at) == (run.id, fire_at) for a in map(parse_announcement, heard))

    await wait_until_async(arrived, 15, what="the edit's notice", interval=0)
    node._absorb(heard)


async def _state(store: Store, run: Run) -> str:
    return (await store.runs_get(run.tenant_id, run.id)).state.value


async def test_a_run_moved_earlier_fires_at_its_new_instant_with_the_new_template(
    store: Store,
) -> None:
    job, run = await _job(store, at(40), payload={"v": 1})
    time = FakeTime(T0)
    node = _node(store, time)
    sub = store.subscribe(CHANNEL_RUNS_NEW)
    try:
        assert await node.run_once() == 0
        assert len(node.window) == 1  # held at its instant, 40 s away
        await _edit(store, job, T0, schedule={"at": at(5).isoformat()}, payload={"v": 2})
        await _hear(node, sub, run, at(5))
    finally:
        sub.close()
    assert node.window.next_fire_at() == at(5)
    time.value = at(5)
    assert await node.run_once() == 1
    fired = await store.runs_get(job.tenant_id, run.id)
    assert (fired.state.value, fired.dispatched_at, fired.payload) == (
        "DISPATCHED",
        at(5),
        {"v": 2},
    )
    worker = await store.workers_register(
        job.tenant_id, pool="default", capabilities=[], tags=[], capacity=1, now=at(5)
    )
    [leased] = await store.attempts_lease(worker=worker, max=1, now=at(6))
    assert leased.payload == {"v": 2}


async def test_a_run_moved_later_does_not_fire_at_its_old_instant(store: Store) -> None:
    job, run = await _job(store, at(10))
    time = FakeTime(T0)
    node = _node(store, time)
    await node.run_once()
    # No notice heard (another process's edit on SQLite, a lost LISTEN): the node still
    # holds it at 10 s. Firing there is refused by the row's fire time.
    await _edit(store, job, T0, schedule={"at": at(30).isoformat()})
    time.value = at(10)
    assert await node.run_once() == 0
    assert await _state(store, run) == "SCHEDULED"
    # The poll finds it as its new instant comes.
    for second in (29.5, 30):
        time.value = at(second)
        await node.run_once()
    assert await _state(store, run) == "DISPATCHED"
    assert (await store.runs_get(job.tenant_id, run.id)).dispatched_at == at(30)


async def test_a_recurring_job_fires_by_its_new_schedule_and_template(store: Store) -> None:
    """A recurring job edited while its run is held: the run fires at the new schedule's
    occurrence with the new template, and the next occurrence comes from the new
    schedule with it too."""
    job, run = await _job(store, at(20), schedule={"interval": 20}, payload={"v": 1})
    time = FakeTime(T0)
    node = _node(store, time)
    sub = store.subscribe(CHANNEL_RUNS_NEW)
    try:
        await node.run_once()
        edited = await _edit(store, job, at(1), schedule={"interval": 15}, payload={"v": 2})
        assert edited.next_due_at == at(15)
        await _hear(node, sub, run, at(15))
    finally:
        sub.close()
    time.value = at(15)
    assert await node.run_once() == 1
    page = await store.runs_list(job.tenant_id, filter=RunFilter(job_id=job.id))
    found = sorted(page.items, key=lambda r: r.due_at)
    assert [(r.id == run.id, r.state.value, r.due_at, r.payload) for r in found] == [
        (True, "DISPATCHED", at(15), {"v": 2}),
        (False, "SCHEDULED", at(30), {"v": 2}),
    ]
    time.value = at(20)  # the old instant: nothing
    assert await node.run_once() == 0
