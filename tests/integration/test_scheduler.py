"""The scheduler node against a real store, with an injectable clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import Operation, OperationState, Selector
from cronwheel.domain.model import NewJob
from cronwheel.domain.spec import JobSpec
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import HeartbeatItem, Store
from cronwheel.testing import wait_until_async

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class FakeTime:
    """A local clock the test moves by hand."""

    def __init__(self, start: datetime) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value


async def _jobs(store: Store, dues: list[datetime], **spec: object) -> list[object]:
    tenant = await store.tenants_create(name=f"t{len(dues)}", limits={}, now=T0)
    base = {"name": "j", "schedule": {"asap": True}, "task": "noop"} | spec
    made = await store.jobs_create_many(
        tenant.id,
        jobs=[NewJob(spec=JobSpec.model_validate(base), first_due_at=d) for d in dues],
        now=T0,
    )
    return [run for _, run, _ in made]


def _node(store: Store, time: Callable[[], datetime], **kw: object) -> SchedulerNode:
    settings = Settings(window_seconds=30, shard_lease_ttl=10, dispatch_lead=0)
    node = SchedulerNode(
        store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)), **kw
    )  # type: ignore[arg-type]
    return node


def _leading_node(store: Store, time: Callable[[], datetime]) -> SchedulerNode:
    """A node that dispatches every run 5 s ahead of its instant."""
    settings = Settings(
        window_seconds=30, shard_lease_ttl=10, dispatch_lead=5, dispatch_lead_burst=1
    )
    return SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))


async def _states(store: Store, tenant_runs: list[object]) -> list[str]:
    out = []
    for run in tenant_runs:
        r = await store.runs_get(run.tenant_id, run.id)  # type: ignore[attr-defined]
        out.append(r.state.value)
    return out


async def test_fires_due_runs_and_leaves_future_ones(store: Store) -> None:
    runs = await _jobs(store, [T0 + timedelta(seconds=s) for s in (0, 1, 5, 3600)])
    time = FakeTime(T0)
    node = _node(store, time)
    assert await node.run_once() == 1
    time.value = T0 + timedelta(seconds=2)
    assert await node.run_once() == 1
    assert await _states(store, runs) == ["DISPATCHED", "DISPATCHED", "SCHEDULED", "SCHEDULED"]
    # The hour-away run is not held in memory: only the 5 s one is in the window.
    assert len(node.window) == 1
    time.value = T0 + timedelta(seconds=6)
    assert await node.run_once() == 1
    assert await _states(store, runs) == ["DISPATCHED", "DISPATCHED", "DISPATCHED", "SCHEDULED"]


async def test_dispatch_lead_hands_runs_to_the_ready_queue_ahead(store: Store) -> None:
    """With a dispatch lead, runs due within it are dispatched now; workers still lease
    each only from its instant."""
    runs = await _jobs(store, [T0 + timedelta(seconds=s) for s in (1, 3, 10)])
    time = FakeTime(T0)
    node = _leading_node(store, time)
    assert await node.run_once() == 2
    assert await _states(store, runs) == ["DISPATCHED", "DISPATCHED", "SCHEDULED"]
    # It sleeps until the next run is within the lead, not until its instant.
    assert node._sleep_for() <= 5.0 + 0.001
    worker = await store.workers_register(
        runs[0].tenant_id,  # type: ignore[attr-defined]
        pool="default",
        capabilities=[],
        tags=[],
        capacity=10,
        now=T0,
    )
    leased = await store.attempts_lease(worker=worker, max=10, now=T0 + timedelta(seconds=2))
    assert [a.run_id for a in leased] == [runs[0].id]  # type: ignore[attr-defined]
    time.value = T0 + timedelta(seconds=5)
    assert await node.run_once() == 1
    assert await _states(store, runs) == ["RUNNING", "DISPATCHED", "DISPATCHED"]


async def test_bursts_gathered_beyond_the_lead_are_dispatched_with_the_first(
    store: Store,
) -> None:
    """A pass that dispatches a burst ahead takes the bursts due a little after the lead
    with it: those are dispatched too, not dropped from the window to wait for a poll
    that finds them a moment before their instant."""
    first = T0 + timedelta(seconds=5)
    gathered = T0 + timedelta(seconds=5.5)  # within the gather (a fifth of the lead)
    later = T0 + timedelta(seconds=7)  # beyond it
    runs = await _jobs(store, [first, gathered, later])
    time = FakeTime(T0)
    node = _leading_node(store, time)
    assert await node.run_once() == 2
    assert await _states(store, runs) == ["DISPATCHED", "DISPATCHED", "SCHEDULED"]
    assert len(node.window) == 1  # the later one, still held for its own pass


async def test_a_run_whose_job_guards_against_overlap_goes_at_its_instant(
    store: Store,
) -> None:
    """Dispatched ahead, a run would be judged against runs that are still to come or
    to end: the runs of jobs with an overlap policy are fired at their instant, the
    others due then ahead of it."""
    due = T0 + timedelta(seconds=2)
    free = await _jobs(store, [due], schedule={"interval": 60, "overlap": "allow"})
    guarded = await _jobs(store, [due, due], schedule={"interval": 60, "overlap": "skip"})
    time = FakeTime(T0)
    node = _leading_node(store, time)
    assert await node.run_once() == 1
    assert await _states(store, [*free, *guarded]) == ["DISPATCHED", "SCHEDULED", "SCHEDULED"]
    # Held for its instant, not tried again at every wake before it.
    assert node.window.next_fire_at(node._lead) == due
    time.value = due - timedelta(seconds=1)
    assert await node.run_once() == 0
    time.value = due
    assert await node.run_once() == 2
    assert await _states(store, [*free, *guarded]) == ["DISPATCHED"] * 3


async def test_only_bursts_are_dispatched_ahead(store: Store) -> None:
    """The lead applies to instants with at least ``dispatch_lead_burst`` runs: a burst
    is dispatched ahead, a run due alone at its instant."""
    alone = T0 + timedelta(seconds=2)
    burst = T0 + timedelta(seconds=3)
    runs = await _jobs(store, [alone, burst, burst, burst])
    time = FakeTime(T0)
    settings = Settings(
        window_seconds=30, shard_lease_ttl=10, dispatch_lead=5, dispatch_lead_burst=3
    )
    node = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    assert await node.run_once() == 3
    assert await _states(store, runs) == ["SCHEDULED", "DISPATCHED", "DISPATCHED", "DISPATCHED"]
    # Its next wake for firing is the lone run's instant, not that instant less the lead.
    assert node.window.next_fire_at(node._lead) == alone
    assert node._sleep_for() > 0
    time.value = alone
    assert await node.run_once() == 1
    assert await _states(store, runs) == ["DISPATCHED"] * 4


async def test_a_refill_reads_only_beyond_the_window(store: Store, monkeypatch) -> None:
    """The window slides by reading the slice past its horizon, not what it holds."""
    runs = await _jobs(store, [T0 + timedelta(seconds=s) for s in (1, 20, 40)])
    time = FakeTime(T0)
    node = _node(store, time)
    scans: list[tuple[datetime | None, datetime]] = []
    scan = store.runs_due_scan

    async def recording(**kw: Any) -> Any:
        scans.append((kw.get("since"), kw["until"]))
        return await scan(**kw)

    monkeypatch.setattr(store, "runs_due_scan", recording)
    await node.run_once()
    time.value = T0 + timedelta(seconds=16)  # past half the window: it slides
    await node.run_once()
    refills = [
        (since, until) for since, until in scans if until - time.value >= timedelta(seconds=30)
    ]
    assert scans[0] == (None, T0 + timedelta(seconds=30))
    assert refills[-1] == (T0 + timedelta(seconds=30), T0 + timedelta(seconds=46))
    for second in (21, 41):
        time.value = T0 + timedelta(seconds=second)
        await node.run_once()
    assert await _states(store, runs) == ["DISPATCHED"] * 3


async def test_run_fires_asap_job_created_while_running(store: Store) -> None:
    node = SchedulerNode(store, Settings(window_seconds=30), node_id="node-live")
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        await wait_until_async(lambda: bool(node.shards), 10, what="the node to hold shards")
        now = await store.db_now()
        runs = await _jobs(store, [now])
        run = runs[0]
        await wait_until_async(lambda: _in_state(store, run, "DISPATCHED"), 10, what="dispatch")
        fired = await store.runs_get(run.tenant_id, run.id)  # type: ignore[attr-defined]
        assert fired.dispatched_at is not None
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    # Stopping gives the shards back.
    assert all(row["owner"] is None for row in await store.shard_leases_list())


async def test_node_without_lease_fires_nothing(store: Store) -> None:
    runs = await _jobs(store, [T0])
    time = FakeTime(T0)
    other = await store.shard_leases_acquire(
        node_id="someone-else", shards=range(256), ttl=600, now=T0
    )
    assert len(other) == 256
    node = _node(store, time)
    assert await node.run_once() == 0
    assert node.shards == {}
    assert await _states(store, runs) == ["SCHEDULED"]


async def test_expired_lease_is_retried(store: Store) -> None:
    runs = await _jobs(store, [T0], heartbeat_timeout=5)
    time = FakeTime(T0)
    node = _node(store, time)
    await node.run_once()
    worker = await store.workers_register(
        None, pool="default", capabilities=[], tags=[], capacity=1, now=T0
    )
    leased = await store.attempts_lease(worker=worker, max=1, now=T0)
    assert len(leased) == 1
    late = T0 + timedelta(seconds=30)
    assert await store.attempts_expire(now=late) == 1
    run = await store.runs_get(runs[0].tenant_id, runs[0].id)  # type: ignore[attr-defined]
    assert run.state.value == "SCHEDULED"
    assert "lease expired" in (run.reason or "")
    refused = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(leased[0].attempt_id, leased[0].fencing_token)], now=late
    )
    assert not refused[0].ok


async def _in_state(store: Store, run: object, state: str) -> bool:
    r = await store.runs_get(run.tenant_id, run.id)  # type: ignore[attr-defined]
    return bool(r.state.value == state)


async def test_nodes_share_the_shards_and_take_over_a_dead_ones(store: Store) -> None:
    time = FakeTime(T0)
    settings = Settings(window_seconds=30, shard_lease_ttl=10)
    a = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    b = SchedulerNode(store, settings, node_id="node-b", clock=Clock(time, offset=timedelta(0)))
    await a.run_once()
    assert len(a.shards) == 256  # alone, it takes everything
    await b.run_once()  # b joins: nothing is free yet
    for _ in range(3):  # a few renewals: a hands back its excess, b takes it
        time.value += timedelta(seconds=4)
        await a.run_once()
        await b.run_once()
    assert len(a.shards) == len(b.shards) == 128
    assert set(a.shards).isdisjoint(b.shards)
    # a dies: its leases expire, b takes every one of them over.
    time.value += timedelta(seconds=11)
    await b.run_once()
    assert len(b.shards) == 256


async def test_a_survivor_takes_over_the_moment_a_dead_nodes_leases_end(store: Store) -> None:
    """Not on its next renewal (up to a third of the TTL later): at the expiry itself."""
    time = FakeTime(T0)
    settings = Settings(window_seconds=30, shard_lease_ttl=9)
    a = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    b = SchedulerNode(store, settings, node_id="node-b", clock=Clock(time, offset=timedelta(0)))
    await a.run_once()  # a renews at 3, 6, 9, 12 s...
    time.value += timedelta(seconds=1.5)
    await b.run_once()  # ...b at 4.5, 7.5, 10.5, 13.5 s
    for _ in range(4):
        time.value += timedelta(seconds=1.5)
        await a.run_once()
        time.value += timedelta(seconds=1.5)
        await b.run_once()
    assert len(a.shards) == len(b.shards) == 128
    # Only shard 0's owner ends lost attempts; the other node does not spin for it.
    assert 0 in a.shards and 0 not in b.shards and b._sleep_for() > 0
    # a renewed last at 12 s: its leases end at 21 s. b's own renewals come at 16.5,
    # 19.5 and 22.5 s.
    a_ends = T0 + timedelta(seconds=12 + 9)
    # a dies; b keeps going, waking when it means to
    while len(b.shards) < 256 and time.value < a_ends + timedelta(seconds=3):
        time.value += timedelta(seconds=b._sleep_for())
        await b.run_once()
    assert len(b.shards) == 256
    assert a_ends < time.value <= a_ends + timedelta(milliseconds=5)


class SkewedTime:
    """The real clock, off by ``skew`` seconds (changeable: a clock that steps)."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def __call__(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.skew)


@pytest.mark.parametrize("skew", [2.0, 0.0, -2.0])
async def test_a_skewed_local_clock_fires_by_database_time(store: Store, skew: float) -> None:
    """A node whose local clock is off by ±2 s measures the offset and fires by the
    database's clock: never early, and as soon after the instant as without skew. (No
    dispatch lead: the instant itself is what is measured.)"""
    node = SchedulerNode(
        store,
        Settings(window_seconds=30, dispatch_lead=0),
        node_id=f"skew{skew}",
        clock=Clock(SkewedTime(skew)),
    )
    start = await store.db_now()
    dues = [start + timedelta(seconds=s) for s in (1.5, 2.0, 2.0, 2.5, 3.0)]
    runs = await _jobs(store, dues)

    async def dispatched() -> bool:
        return "SCHEDULED" not in await _states(store, runs)

    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        await wait_until_async(dispatched, 30, what="the runs to be dispatched", interval=0.1)
    finally:
        stop.set()
        await task
    assert abs(node.clock.offset.total_seconds() + skew) < 0.5  # measured
    for run in runs:
        got = await store.runs_get(run.tenant_id, run.id)  # type: ignore[attr-defined]
        assert got.dispatched_at is not None
        lateness = (got.dispatched_at - got.due_at).total_seconds()
        # Never early by the database's clock; a local clock 2 s behind would make every
        # run at least 2 s late without the correction.
        assert 0 <= lateness < 1.5, (skew, lateness)


async def test_a_node_whose_clock_steps_gives_up_its_shards(store: Store) -> None:
    """An offset that moves by more than the bound between two readings (the local clock
    stepped) makes the node hand its shards back; once readings agree again it takes
    them back."""
    time = SkewedTime(0.0)
    settings = Settings(window_seconds=30, max_clock_uncertainty=1.0)
    node = SchedulerNode(store, settings, node_id="stepper", clock=Clock(time))
    await node.run_once()
    assert len(node.shards) == 256
    owned = [lease for lease in await store.shard_leases_list() if lease["owner"] == "stepper"]
    assert len(owned) == 256
    time.skew = 3.0  # the local clock jumps 3 s ahead
    node._next_clock = datetime.min.replace(tzinfo=UTC)
    await node.run_once()
    assert node.shards == {}
    assert node.clock.drift >= timedelta(seconds=2.5)
    leases = await store.shard_leases_list()
    assert not [lease for lease in leases if lease["owner"] == "stepper"]
    # Stable again: the next reading agrees with the last, the node comes back.
    node._next_clock = datetime.min.replace(tzinfo=UTC)
    await node.run_once()
    assert len(node.shards) == 256
    assert abs(node.clock.offset.total_seconds() + 3.0) < 0.5


async def test_a_full_ready_queue_is_looked_at_again_at_once_while_p0_waits(
    store: Store,
) -> None:
    await _jobs(store, [T0] * 20, priority=2)
    time = FakeTime(T0)
    settings = Settings(
        window_seconds=30,
        shard_lease_ttl=10,
        dispatch_lead=0,
        dispatch_lead_burst=5,
        dispatch_buffer=10,
    )
    node = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    assert await node.run_once() == 10
    later = T0 + timedelta(seconds=1)
    billing = await _jobs(store, [later] * 6, priority=0)
    time.value = later
    assert await node.run_once() == 0  # no room, even for P0
    assert await _states(store, billing) == ["SCHEDULED"] * 6
    assert node._next_release == later + timedelta(seconds=settings.release_interval)


async def test_a_burst_is_released_as_the_pool_takes_it_p0_first(store: Store) -> None:
    """A burst larger than the pool's room waits SCHEDULED in the node's backlog; what
    goes to the ready queue is P0 first, and more goes as workers take the ready runs."""
    flood = await _jobs(store, [T0] * 40, priority=2)
    billing = await _jobs(store, [T0] * 3, priority=0)
    time = FakeTime(T0)
    settings = Settings(
        window_seconds=30,
        shard_lease_ttl=10,
        dispatch_lead=0,
        dispatch_lead_burst=5,
        dispatch_buffer=10,
    )
    node = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    assert await node.run_once() == 10  # the room: no live worker, so the buffer
    assert await _states(store, billing) == ["DISPATCHED"] * 3
    assert (await _states(store, flood)).count("DISPATCHED") == 7
    assert len(node.backlog) == 33
    interval = timedelta(seconds=settings.release_interval)
    assert node._next_release == T0 + interval
    assert await node.run_once() == 0  # the ready queue is full
    assert node._next_release == T0 + 5 * interval  # so the next look can wait
    tenant_id = flood[0].tenant_id  # type: ignore[attr-defined]
    worker = await store.workers_register(
        None, pool="default", capabilities=(), tags=(), capacity=2, now=T0
    )
    leased = await store.attempts_lease(worker=worker, max=6, now=T0 + timedelta(seconds=1))
    assert len(leased) == 6 and sum(a.tenant_id == tenant_id for a in leased) == 3
    time.value = T0 + timedelta(seconds=1)
    assert await node.run_once() == 6  # room again, for as many as were taken
    assert len(node.backlog) == 27
    # Cancelled while waiting in the backlog: never fired.
    states = await _states(store, flood)
    waiting = [r for r, s in zip(flood, states, strict=True) if s == "SCHEDULED"]
    await store.runs_cancel(tenant_id, waiting[0].id, actor=Actor("t"))  # type: ignore[attr-defined]
    fired = 0
    for i in range(10):
        leased = await store.attempts_lease(
            worker=worker, max=100, now=T0 + timedelta(seconds=2 + i)
        )
        time.value = T0 + timedelta(seconds=2 + i)
        fired += await node.run_once()
    assert not node.backlog
    assert fired == 26
    assert (await _states(store, flood)).count("SCHEDULED") == 0


async def test_a_burst_larger_than_a_refill_is_read_whole(store: Store) -> None:
    """A refill that stops at its limit inside one instant goes on inside it next time:
    runs held back (still SCHEDULED) never hide the rest of the burst, nor what comes
    after it."""
    burst = await _jobs(store, [T0] * 25)
    after = await _jobs(store, [T0 + timedelta(seconds=1)] * 3)
    time = FakeTime(T0)
    settings = Settings(
        window_seconds=30,
        shard_lease_ttl=10,
        dispatch_lead=0,
        dispatch_lead_burst=2,
        dispatch_buffer=1,  # one run in the ready queue at a time: the rest held
    )
    node = SchedulerNode(
        store,
        settings,
        node_id="node-a",
        clock=Clock(time, offset=timedelta(0)),
        poll_interval=3600.0,  # refills alone
    )
    node.refill_limit = 10
    fired = 0
    for i in range(4):
        time.value = T0 + timedelta(seconds=1 + i)
        fired += await node.run_once()
    # Every run was read: fired, or waiting in the backlog.
    assert fired + len(node.backlog) == 28
    assert {r.id for r in burst + after} >= set(node.backlog._ids)  # type: ignore[attr-defined]


async def test_polls_page_past_runs_held_back(store: Store) -> None:
    """Runs a poll finds that stay SCHEDULED (held in the backlog) do not hide the ones
    behind them from the next poll."""
    burst = await _jobs(store, [T0] * 25)
    time = FakeTime(T0)
    node = _node(store, time)
    node.poll_limit = 10
    await node._renew_leases()  # holds every shard
    node.window.horizon = T0 + timedelta(days=1)  # no refill: only polls find them
    seen: set[object] = set()
    for i in range(4):
        time.value = T0 + timedelta(seconds=2 * (i + 1))
        await node._poll(time.value)
        seen |= {r.id for r in node.window.pop_due(time.value)}
        node.backlog.add(await store.runs_releasable(run_ids=list(seen)))
    assert seen == {r.id for r in burst}  # type: ignore[attr-defined]


async def test_the_node_owning_shard_0_applies_audit_retention(store: Store) -> None:
    tenant = await store.tenants_create(name="audited", limits={}, now=T0)
    who = Actor("k1", role="admin")
    await store.tenants_update(tenant.id, limits={"weight": 2.0}, actor=who, now=T0)
    await store.tenants_update(
        tenant.id, limits={"weight": 3.0}, actor=who, now=T0 + timedelta(days=9)
    )
    settings = Settings(window_seconds=30, shard_lease_ttl=10, audit_retention_days=5)
    # The second record is 5 days old at T0 + 14 days.
    time = FakeTime(T0 + timedelta(days=14) - timedelta(minutes=30))
    node = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    await node.run_once()
    await node.chores_done()
    assert 0 in node.shards
    [kept] = (await store.audit_list(tenant.id)).items
    assert kept.after == {"limits": {"weight": 3.0}}
    # Hourly: a record that expires meanwhile waits for the next hour's pass.
    time.value += timedelta(minutes=40)
    await node.run_once()
    await node.chores_done()
    assert len((await store.audit_list(tenant.id)).items) == 1
    time.value += timedelta(minutes=30)
    await node.run_once()
    await node.chores_done()
    assert (await store.audit_list(tenant.id)).items == []


async def test_the_same_hourly_chore_removes_finished_operations(store: Store) -> None:
    tenant = await store.tenants_create(name="operated", limits={}, now=T0)
    who = Actor("k1", role="operator")

    async def accept(at: datetime) -> Operation:
        return await store.operations_create(
            tenant.id, action="pause", selector=Selector(all=True), actor=who, now=at
        )

    async def finish(op: Operation, at: datetime) -> None:
        assert await store.operations_claim(owner="api", ttl=10, now=at) is not None
        step = await store.operations_step(op.id, owner="api", ttl=10, now=at)
        while step.state is not OperationState.DONE:
            step = await store.operations_step(op.id, owner="api", ttl=10, now=at)

    old = await accept(T0)
    await finish(old, T0)
    young = await accept(T0 + timedelta(days=9))
    await finish(young, T0 + timedelta(days=9))
    still_open = await accept(T0 + timedelta(days=9))
    settings = Settings(window_seconds=30, shard_lease_ttl=10, operation_retention_days=5)
    # The young one finished 5 days before T0 + 14 days: not yet older than that.
    time = FakeTime(T0 + timedelta(days=14) - timedelta(minutes=30))
    node = SchedulerNode(store, settings, node_id="node-a", clock=Clock(time, offset=timedelta(0)))
    await node.run_once()
    await node.chores_done()
    assert 0 in node.shards
    left = {o.id for o in (await store.operations_list(tenant.id)).items}
    assert left == {young.id, still_open.id}
    # Hourly, beside the audit trail's retention (which keeps who asked for them).
    time.value += timedelta(minutes=40)
    await node.run_once()
    await node.chores_done()
    assert len((await store.operations_list(tenant.id)).items) == 2
    time.value += timedelta(minutes=30)
    await node.run_once()
    await node.chores_done()
    assert [o.id for o in (await store.operations_list(tenant.id)).items] == [still_open.id]
    assert len((await store.audit_list(tenant.id, action="bulk.pause")).items) == 3
