"""Missed runs and stalled schedules (docs/alerts.md), on both backends: the store
marks a run missed once, past its job's lateness budget; a scheduler node does it as
part of its pass, counts it by tenant, and keeps a row that fails alone out of the
check; a recurring job left with no run to fire its next occurrence is found stalled
and resumed once it has one again."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.domain.job_edit import job_edit, spec_json
from cronwheel.domain.model import NewJob, Run
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.spec import JobSpec
from cronwheel.metrics import REGISTRY
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.store.schema import NUM_SHARDS

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ALL = list(range(NUM_SHARDS))


class FakeTime:
    def __init__(self, start: datetime) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value

    def at(self, seconds: float) -> None:
        self.value = T0 + timedelta(seconds=seconds)


def _node(store: Store, time: FakeTime) -> SchedulerNode:
    settings = Settings(window_seconds=30, shard_lease_ttl=10, dispatch_lead=0)
    return SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))


async def _runs(
    store: Store, tenant_id: uuid.UUID, dues: Sequence[datetime], **spec: Any
) -> list[Run]:
    base = {"name": "j", "schedule": {"asap": True}, "task": "noop"} | spec
    made = await store.jobs_create_many(
        tenant_id,
        jobs=[NewJob(spec=JobSpec.model_validate(base), first_due_at=d) for d in dues],
        now=T0,
    )
    return [run for _, run, _ in made if run is not None]


async def _kinds(store: Store, tenant_id: uuid.UUID, **where: uuid.UUID) -> list[str]:
    page = await store.events_list(tenant_id, limit=1000, **where)
    return [e.kind for e in page.items]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_run_past_its_budget_is_marked_missed_once(store: Store) -> None:
    tenant = await store.tenants_create(name="acme", limits={}, now=T0)
    other = await store.tenants_create(name="other", limits={}, now=T0)
    [quick] = await _runs(store, tenant.id, [T0], lateness_budget=5)
    [slow, later] = await _runs(store, tenant.id, [T0, T0 + timedelta(hours=1)])

    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    assert await store.runs_mark_missed(shards=ALL, now=at(seconds=4)) == []
    [missed] = await store.runs_mark_missed(shards=ALL, now=at(seconds=6), actor="node-a")
    assert (missed.run_id, missed.tenant_name, missed.priority) == (quick.id, "acme", 2)
    assert missed.missed_at == at(seconds=6)
    # Once: a later check finds nothing new; a node holding other shards nothing at all.
    assert await store.runs_mark_missed(shards=ALL, now=at(seconds=7)) == []
    elsewhere = [s for s in ALL if s != slow.shard]
    assert await store.runs_mark_missed(shards=elsewhere, now=at(seconds=31)) == []
    [second] = await store.runs_mark_missed(shards=ALL, now=at(seconds=31))
    assert second.run_id == slow.id

    now = await store.runs_missed(None, now=at(seconds=40))
    assert [m.run_id for m in now] == sorted([quick.id, slow.id], key=lambda i: (T0, i))
    assert await store.runs_missed(other.id, now=at(seconds=40)) == []
    assert later.id not in {m.run_id for m in now}
    events = await store.events_list(tenant.id, run_id=quick.id, limit=100)
    [event] = [e for e in events.items if e.kind == "run.missed"]
    assert event.actor == "node-a" and "lateness budget" in (event.reason or "")

    # Pausing the job parks its run far ahead: it is no longer missed.
    await store.jobs_pause(tenant.id, quick.job_id, now=at(seconds=41))
    assert [m.run_id for m in await store.runs_missed(None, now=at(seconds=42))] == [slow.id]


async def test_a_node_marks_counts_and_then_fires_a_missed_run(store: Store) -> None:
    tenant = await store.tenants_create(name=f"n-{uuid.uuid4().hex[:6]}", limits={}, now=T0)
    [run] = await _runs(store, tenant.id, [T0], lateness_budget=5, priority=1)
    before = _sample("cronwheel_runs_missed_total", tenant=tenant.name)
    lateness = _sample(
        "cronwheel_dispatch_lateness_seconds_count", tenant=tenant.name, priority="P1"
    )
    time = FakeTime(T0 + timedelta(seconds=10))  # the node comes up late: the run was missed
    node = _node(store, time)
    assert await node.run_once() == 1

    assert "run.missed" in await _kinds(store, tenant.id, run_id=run.id)
    assert (await store.runs_get(tenant.id, run.id)).state.value == "DISPATCHED"
    assert _sample("cronwheel_runs_missed_total", tenant=tenant.name) == before + 1
    assert (
        _sample("cronwheel_dispatch_lateness_seconds_count", tenant=tenant.name, priority="P1")
        == lateness + 1
    )
    # Dispatched: no longer missed.
    assert await store.runs_missed(tenant.id, now=time.value) == []


async def test_a_run_the_check_fails_on_alone_is_left_out(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = await store.tenants_create(name="iso", limits={}, now=T0)
    runs = await _runs(store, tenant.id, [T0, T0, T0], lateness_budget=5)
    poison = runs[1].id
    real = store.runs_mark_missed
    calls: list[list[uuid.UUID] | None] = []

    async def failing(**kw: Any) -> Any:
        ids = kw.get("run_ids")
        calls.append(None if ids is None else list(ids))
        if ids is None or poison in ids:
            raise RuntimeError("the database refused a value")
        return await real(**kw)

    monkeypatch.setattr(store, "runs_mark_missed", failing)
    time = FakeTime(T0 + timedelta(seconds=10))
    node = _node(store, time)
    await node._renew_leases()
    await node._check_missed()
    missed = {m.run_id for m in await store.runs_missed(tenant.id, now=time.value)}
    assert missed == {runs[0].id, runs[2].id}
    assert poison in node._missed_skip

    # The next check leaves it out without a split: one call, the others already marked.
    calls.clear()
    await node._check_missed()
    assert calls == []  # nothing left to mark: no batch to try


async def test_a_schedule_left_without_a_run_stalls_and_resumes(store: Store) -> None:
    tenant = await store.tenants_create(name="stall", limits={}, now=T0)
    spec = {"schedule": {"interval": 60, "start": T0.isoformat()}, "name": "every-minute"}
    [run] = await _runs(store, tenant.id, [T0], **spec)
    # A step of a pass failed on its run alone: nothing is left to fire the next one.
    await store.runs_quarantine(run_ids=[run.id], step="fire", error="boom", now=T0)
    stalled_before = _sample("cronwheel_schedules_stalled_total")
    time = FakeTime(T0 + timedelta(seconds=80))  # next occurrence T0+60, budget 30 s
    node = _node(store, time)
    await node.run_once()
    assert await store.jobs_stalled(tenant.id) == []

    time.at(100)
    node._next_missed_check = T0
    await node.run_once()
    [stalled] = await store.jobs_stalled(tenant.id)
    assert (stalled.job_id, stalled.job_name) == (run.job_id, "every-minute")
    assert stalled.stalled_at == T0 + timedelta(seconds=100)
    assert _sample("cronwheel_schedules_stalled_total") == stalled_before + 1
    node._next_missed_check = T0
    await node.run_once()  # once: no second event
    kinds = await _kinds(store, tenant.id, job_id=run.job_id)
    assert kinds.count("job.schedule_stalled") == 1
    assert await store.jobs_stalled(None) != []

    # A new schedule gives the job a run again: the schedule resumes.
    job = await store.jobs_get(tenant.id, run.job_id)
    patched = {**spec_json(job), "schedule": {"interval": 120, "start": T0.isoformat()}}
    now = T0 + timedelta(seconds=101)
    edit = job_edit(job, JobSpec.model_validate(patched), now=now, limits=JobLimits())
    await store.jobs_update(tenant.id, job.id, edit=edit, now=now)
    time.at(106)
    node._next_missed_check = T0
    await node.run_once()
    assert await store.jobs_stalled(tenant.id) == []
    kinds = await _kinds(store, tenant.id, job_id=run.job_id)
    assert kinds.count("job.schedule_resumed") == 1


async def test_a_paused_stalled_job_is_no_longer_stalled(store: Store) -> None:
    tenant = await store.tenants_create(name="paused", limits={}, now=T0)
    spec = {"schedule": {"cron": "* * * * *"}, "name": "minutely"}
    [run] = await _runs(store, tenant.id, [T0], **spec)
    await store.runs_quarantine(run_ids=[run.id], step="fire", error="boom", now=T0)
    time = FakeTime(T0 + timedelta(seconds=120))
    node = _node(store, time)
    await node.run_once()
    assert [s.job_id for s in await store.jobs_stalled(tenant.id)] == [run.job_id]
    await store.jobs_pause(tenant.id, run.job_id, now=time.value)
    time.at(125)
    node._next_missed_check = T0
    await node.run_once()
    assert await store.jobs_stalled(tenant.id) == []
