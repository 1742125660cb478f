"""The scheduler's side: shard leases, the due-window scan, and firing due runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from cronwheel.domain.model import Run
from cronwheel.domain.states import RunState
from cronwheel.store import Store, create_store

from .helpers import (
    ALL_SHARDS,
    NODE,
    T0,
    at,
    create_job,
    create_jobs,
    events_of,
    fire,
    hold_all_shards,
    make_tenant,
    transitions_of,
)

MONTHS = 90 * 86400


async def test_due_scan_returns_scheduled_runs_soonest_first(store: Store) -> None:
    tenant = await make_tenant(store)
    runs: dict[str, Run] = {}
    for label, due in (("late", 10), ("now", 0), ("past", -5), ("edge", 30), ("far", MONTHS)):
        runs[label] = (await create_job(store, tenant.id, due_at=at(due)))[1]
    cancelled = (await create_job(store, tenant.id, due_at=at(1)))[1]
    await store.runs_cancel(tenant.id, cancelled.id, now=T0)

    # ``until`` is exclusive; months-away and cancelled runs are not in the window.
    window = await store.runs_due_scan(shards=ALL_SHARDS, until=at(30))
    assert [d.id for d in window] == [runs["past"].id, runs["now"].id, runs["late"].id]
    assert [(d.shard, d.fire_at) for d in window] == [
        (runs[k].shard, runs[k].fire_at) for k in ("past", "now", "late")
    ]
    assert [d.id for d in await store.runs_due_scan(shards=ALL_SHARDS, until=at(30), limit=2)] == [
        runs["past"].id,
        runs["now"].id,
    ]
    assert await store.runs_due_scan(shards=[], until=at(30)) == []

    # Only the shards asked for.
    shard = runs["late"].shard
    mine = await store.runs_due_scan(shards=[shard], until=at(MONTHS + 1))
    expected = sorted((r for r in runs.values() if r.shard == shard), key=lambda r: r.fire_at)
    assert [d.id for d in mine] == [r.id for r in expected]
    others = [s for s in ALL_SHARDS if s != shard]
    assert runs["late"].id not in {
        d.id for d in await store.runs_due_scan(shards=others, until=at(MONTHS + 1))
    }

    # A fired run leaves the window.
    await fire(store, [runs["past"]], now=T0)
    assert runs["past"].id not in {
        d.id for d in await store.runs_due_scan(shards=ALL_SHARDS, until=at(30))
    }


async def test_fire_moves_each_run_once(store: Store) -> None:
    tenant = await make_tenant(store)
    batch = await create_jobs(store, tenant.id, 5, due_at=T0, pool="etl")
    _job, late = await create_job(store, tenant.id, due_at=at(-45), pool="etl")
    batch.append(late)
    await hold_all_shards(store)
    fired = await store.runs_fire(run_ids=[r.id for r in batch], node_id=NODE, now=at(0.5))
    assert {f.id for f in fired} == {r.id for r in batch}
    for f in fired:
        assert (f.tenant_id, f.pool, f.dispatched_at) == (tenant.id, "etl", at(0.5))
        assert f.fire_at == (at(-45) if f.id == late.id else T0)

    again = await store.runs_fire(run_ids=[r.id for r in batch], node_id=NODE, now=at(1))
    assert again == []
    for run in batch:
        after = await store.runs_get(tenant.id, run.id)
        assert after.state is RunState.DISPATCHED
        assert after.dispatched_at == at(0.5)
        assert await transitions_of(store, tenant.id, run.id) == [
            (None, "SCHEDULED"),
            ("SCHEDULED", "DISPATCHED"),
        ]
        [*_, last] = await events_of(store, tenant.id, run_id=run.id)
        assert (last.actor, last.at) == (NODE, at(0.5))
        # A run that goes out late says why; one on time has nothing to explain.
        assert bool(last.reason) == (run.id == late.id)


async def test_fire_leaves_runs_not_yet_due(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(60))
    assert await fire(store, [run], now=T0) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED
    # ``lead`` lets a node fire what its corrected clock says is due, but only that.
    await hold_all_shards(store, now=at(59))
    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(59), lead=0.5) == []
    [fired] = await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(59.5), lead=0.5)
    assert (fired.id, fired.dispatched_at) == (run.id, at(59.5))


async def test_fire_needs_a_live_shard_lease(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=T0)

    # No lease at all.
    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=T0) == []
    # Another node holds the shard.
    held = await store.shard_leases_acquire(node_id="node-b", shards=[run.shard], ttl=10, now=T0)
    assert held == {run.shard: 1}
    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(1)) == []
    # The holder's lease has expired.
    assert await store.runs_fire(run_ids=[run.id], node_id="node-b", now=at(11)) == []
    # Released leases fire nothing either.
    await store.shard_leases_acquire(node_id="node-b", shards=[run.shard], ttl=10, now=at(12))
    await store.shard_leases_release(node_id="node-b", shards=[run.shard])
    assert await store.runs_fire(run_ids=[run.id], node_id="node-b", now=at(13)) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED
    assert await transitions_of(store, tenant.id, run.id) == [(None, "SCHEDULED")]

    await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=10, now=at(14))
    assert [f.id for f in await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(15))] == [
        run.id
    ]


async def test_fire_is_fenced_by_the_lease_epoch(store: Store) -> None:
    """A node whose lease lapsed and that won the shard back under a new epoch fires
    nothing with the epoch it held before; with the current one it does."""
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=T0)
    old = await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=10, now=T0)
    # Lapsed; someone else held it a while; the node takes it back: a new epoch.
    await store.shard_leases_acquire(node_id="node-b", shards=[run.shard], ttl=10, now=at(11))
    await store.shard_leases_release(node_id="node-b", shards=[run.shard])
    new = await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=10, now=at(12))
    assert new[run.shard] > old[run.shard]

    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(13), epochs=old) == []
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED
    fired = await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(13), epochs=new)
    assert [f.id for f in fired] == [run.id]


async def test_a_recurring_run_is_fenced_by_the_lease_epoch_too(store: Store) -> None:
    tenant = await make_tenant(store)
    spec = {"cron": "*/5 * * * *"}
    _job, run = await create_job(store, tenant.id, due_at=T0, schedule=spec)
    assert run.origin == "schedule"
    old = await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=10, now=T0)
    await store.shard_leases_acquire(node_id="node-b", shards=[run.shard], ttl=10, now=at(11))
    await store.shard_leases_release(node_id="node-b", shards=[run.shard])
    new = await store.shard_leases_acquire(node_id=NODE, shards=[run.shard], ttl=10, now=at(12))
    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(13), epochs=old) == []
    fired = await store.runs_fire(run_ids=[run.id], node_id=NODE, now=at(13), epochs=new)
    assert [f.id for f in fired] == [run.id]


async def test_shard_lease_lifecycle(store: Store) -> None:
    a = await store.shard_leases_acquire(node_id="node-a", shards=[0, 1, 2], ttl=10, now=T0)
    assert a == {0: 1, 1: 1, 2: 1}
    # Renewing keeps the epoch.
    assert await store.shard_leases_acquire(
        node_id="node-a", shards=[0, 1, 2], ttl=10, now=at(5)
    ) == {0: 1, 1: 1, 2: 1}
    # Another node cannot take an unexpired lease, only free shards.
    b = await store.shard_leases_acquire(node_id="node-b", shards=[1, 2, 3], ttl=100, now=at(6))
    assert b == {3: 1}
    leases = {row["shard"]: row for row in await store.shard_leases_list()}
    assert {s: (leases[s]["owner"], leases[s]["epoch"]) for s in (0, 1, 2, 3)} == {
        0: ("node-a", 1),
        1: ("node-a", 1),
        2: ("node-a", 1),
        3: ("node-b", 1),
    }
    # node-a's leases ran out at T0+15: node-b takes one with a new epoch.
    b = await store.shard_leases_acquire(node_id="node-b", shards=[1], ttl=100, now=at(16))
    assert b == {1: 2, 3: 1}
    a = await store.shard_leases_acquire(node_id="node-a", shards=[0, 1, 2], ttl=10, now=at(16))
    assert set(a) == {0, 2}
    # Releasing frees a shard at once; the next owner gets a larger epoch.
    await store.shard_leases_release(node_id="node-b", shards=[1])
    await store.shard_leases_release(node_id="node-b", shards=[0])  # not node-b's: no effect
    leases = {row["shard"]: row for row in await store.shard_leases_list()}
    assert leases[1]["owner"] is None
    assert leases[0]["owner"] == "node-a"
    a = await store.shard_leases_acquire(node_id="node-a", shards=[1], ttl=10, now=at(17))
    assert a[1] == 3
    assert set(a) == {0, 1, 2}


async def test_nodes_racing_for_shards_never_share_one(store: Store, store_url: str) -> None:
    nodes = [create_store(store_url) for _ in range(3)]
    for node in nodes:
        await node.open()
    try:
        held = await asyncio.gather(
            *(
                node.shard_leases_acquire(node_id=f"node-{i}", shards=ALL_SHARDS, ttl=30, now=T0)
                for i, node in enumerate(nodes)
            )
        )
    finally:
        for node in nodes:
            await node.close()
    owned = [shard for mine in held for shard in mine]
    assert sorted(owned) == ALL_SHARDS
    assert all(epoch == 1 for mine in held for epoch in mine.values())
    owners = {row["shard"]: row["owner"] for row in await store.shard_leases_list()}
    for i, mine in enumerate(held):
        assert all(owners[s] == f"node-{i}" for s in mine)


async def test_the_database_clock_is_the_default_now(store: Store) -> None:
    before = datetime.now(UTC)
    clock = await store.db_now()
    await store.ping()
    assert clock.utcoffset() == timedelta(0)
    # The test machine runs the database: its clock agrees with ours.
    assert abs(clock - before) < timedelta(seconds=30)
    start = await store.db_now()
    held = await store.shard_leases_acquire(node_id=NODE, shards=[7], ttl=30)
    end = await store.db_now()
    assert held == {7: 1}
    [lease] = [row for row in await store.shard_leases_list() if row["shard"] == 7]
    assert start + timedelta(seconds=30) <= lease["expires_at"] <= end + timedelta(seconds=30)


async def test_scheduler_renewal_beats_counts_and_takes_a_fair_share(store: Store) -> None:
    a = await store.scheduler_renew(node_id="node-a", ttl=10, shards=256, now=T0)
    assert (a.live, a.share, len(a.held)) == (1, 256, 256)
    assert set(a.held.values()) == {1} and a.others_expire_at is None
    b = await store.scheduler_renew(node_id="node-b", ttl=10, shards=256, now=at(1))
    assert (b.live, b.share, b.held) == (2, 128, {})  # nothing free yet
    assert b.others_expire_at == at(10)
    # a renews (the epoch stays) and hands back what is above its share; b takes it.
    a = await store.scheduler_renew(node_id="node-a", ttl=10, shards=256, now=at(2))
    assert (a.live, a.share, len(a.held)) == (2, 128, 256) and set(a.held.values()) == {1}
    await store.shard_leases_release(node_id="node-a", shards=sorted(a.held)[128:])
    b = await store.scheduler_renew(node_id="node-b", ttl=10, shards=256, now=at(3))
    assert sorted(b.held) == list(range(128, 256)) and set(b.held.values()) == {2}
    assert b.others_expire_at == at(12)
    # a falls silent: once its leases end b takes them over, whatever its share, and
    # a no longer counts as live.
    b = await store.scheduler_renew(node_id="node-b", ttl=10, shards=256, now=at(12.5))
    assert (b.live, len(b.held)) == (1, 256)
    assert all(b.held[s] == 2 for s in range(128))  # a new owner: a new epoch
    assert b.others_expire_at is None
    owners = {row["shard"]: row["owner"] for row in await store.shard_leases_list()}
    assert set(owners.values()) == {"node-b"}


async def test_nodes_renewing_at_once_never_share_a_shard(store: Store, store_url: str) -> None:
    nodes = [create_store(store_url) for _ in range(3)]
    for node in nodes:
        await node.open()
    try:
        for _ in range(3):  # join, then settle
            renewals = await asyncio.gather(
                *(
                    node.scheduler_renew(node_id=f"node-{i}", ttl=30, shards=256, now=T0)
                    for i, node in enumerate(nodes)
                )
            )
            owned = [shard for r in renewals for shard in r.held]
            assert len(owned) == len(set(owned))
    finally:
        for node in nodes:
            await node.close()
    owners = {row["shard"]: row["owner"] for row in await store.shard_leases_list()}
    for i, renewal in enumerate(renewals):
        assert all(owners[s] == f"node-{i}" for s in renewal.held)


async def test_survivors_split_a_dead_nodes_shards_by_their_share(store: Store) -> None:
    """The first survivor to renew takes the dead node's shards only up to its share and
    leaves the rest to the other, rather than taking them all and handing some back
    (unowned until someone renews again)."""
    for node, second in (("node-a", 0), ("node-b", 0.1), ("node-c", 0.2)):
        await store.scheduler_renew(node_id=node, ttl=10, shards=256, now=at(second))
    # Settle into thirds: each renews and hands back what is above its share.
    for second in (3.0, 3.1, 3.2, 6.0, 6.1, 6.2):
        node = {0.0: "node-a", 0.1: "node-b", 0.2: "node-c"}[round(second % 1, 1)]
        renewal = await store.scheduler_renew(node_id=node, ttl=10, shards=256, now=at(second))
        extra = sorted(renewal.held)[renewal.share :]
        if extra:
            await store.shard_leases_release(node_id=node, shards=extra)
    owners = [row["owner"] for row in await store.shard_leases_list()]
    assert sorted(owners.count(n) for n in ("node-a", "node-b", "node-c")) == [84, 86, 86]
    # node-c dies after its renewal at 6.2 s: its leases end at 16.2 s. The others go on.
    for second in (9.0, 9.1, 12.0, 12.1, 15.0, 15.1):
        node = "node-a" if round(second % 1, 1) == 0.0 else "node-b"
        await store.scheduler_renew(node_id=node, ttl=10, shards=256, now=at(second))
    a = await store.scheduler_renew(node_id="node-a", ttl=10, shards=256, now=at(16.3))
    assert (a.live, a.share, len(a.held)) == (2, 128, 128)
    b = await store.scheduler_renew(node_id="node-b", ttl=10, shards=256, now=at(16.3))
    assert (b.live, b.share, len(b.held)) == (2, 128, 128)
    owners = [row["owner"] for row in await store.shard_leases_list()]
    assert sorted(set(owners)) == ["node-a", "node-b"]
