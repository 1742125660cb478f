"""Spread through the store, on both backends: first runs and next occurrences fire at
their spread instants (the next occurrence computed in SQL on PostgreSQL, in Python on
SQLite, the same instants), a run never fires before its spread instant, and catch-up,
overlap, pause and resume read spread instants."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cronwheel.domain.model import Run
from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.spec import JobSpec
from cronwheel.store import CompleteItem, RunFilter, Store, create_store
from cronwheel.store.drivers.postgres_firing import spread_instant_sql
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.timing.spread import spread_instant
from pg_server import pg_connect

from .helpers import NODE, T0, make_tenant

LIMITS = JobLimits(max_horizon=timedelta(days=3650))


def _spec(schedule: dict[str, Any], spread: float, **fields: Any) -> JobSpec:
    body = {"name": "spread", "schedule": schedule, "task": "t", "spread": spread, **fields}
    return JobSpec.model_validate(body)


async def _create(
    store: Store, tenant_id: uuid.UUID, spec: JobSpec, count: int = 1, now: datetime = T0
) -> list[Run]:
    made = await store.jobs_create_many(
        tenant_id, jobs=[new_job(spec, now=now, limits=LIMITS) for _ in range(count)], now=now
    )
    out = [run for _job, run, created in made if created and run is not None]
    assert len(out) == count
    return out


async def _fire(store: Store, runs: list[Run], now: datetime, node: str = NODE) -> set[uuid.UUID]:
    shards = sorted({r.shard for r in runs})
    await store.shard_leases_acquire(node_id=node, shards=shards, ttl=3600, now=now)
    fired = await store.runs_fire(run_ids=[r.id for r in runs], node_id=node, now=now)
    return {f.id for f in fired}


async def _runs(store: Store, run: Run) -> list[Run]:
    page = await store.runs_list(run.tenant_id, filter=RunFilter(job_id=run.job_id), limit=1000)
    return sorted(page.items, key=lambda r: r.due_at)


def _expected(run: Run, spread: float) -> datetime:
    return spread_instant(run.job_id, run.due_at, spread)


async def test_postgres_computes_the_spread_instants_python_does() -> None:
    """The next-occurrence statement's expression against ``timing.spread`` on many
    samples: job ids, instants to the microsecond, spreads from 1 ms to a day."""
    rng = random.Random(13)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    jobs = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(5000)]
    dues = [epoch + timedelta(microseconds=rng.randrange(0, 7_000_000_000_000_000)) for _ in jobs]
    spreads = [rng.randrange(0, 86_400_001) / 1000 for _ in jobs]
    spreads[:6] = [0.0, 0.001, 0.5, 59.999, 86399.999, 86400.0]
    conn = await pg_connect()
    try:
        rows = await conn.fetch(
            f"""SELECT {spread_instant_sql("v.j", "v.d", "v.s::numeric")} AS fire_at
                FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) WITH ORDINALITY
                    AS v(j, d, s, n)
                ORDER BY n""",
            jobs,
            dues,
            [json.dumps(s) for s in spreads],  # as the template's JSON holds them
        )
    finally:
        await conn.close()
    got = [r["fire_at"] for r in rows]
    want = [spread_instant(j, d, s) for j, d, s in zip(jobs, dues, spreads, strict=True)]
    assert got == want
    assert sum(g != d for g, d in zip(got, dues, strict=True)) > 4900  # offsets, not zeros


async def test_a_thousand_jobs_on_one_hour_spread_over_the_window(store: Store) -> None:
    """1,000 jobs on ``0 * * * *`` with spread 600: each run fires at its own spread
    instant inside the ten minutes, none before it, spread roughly evenly; the next
    occurrences, created by the driver, too."""
    tenant = await make_tenant(store)
    firsts = await _create(store, tenant.id, _spec({"cron": "0 * * * *"}, 600), count=1000)
    assert {r.due_at for r in firsts} == {T0}
    for r in firsts:
        assert r.fire_at == _expected(r, 600) and T0 <= r.fire_at < T0 + timedelta(seconds=600)

    fired: set[uuid.UUID] = set()
    for step in range(0, 601, 30):  # every 30 s, all of them offered
        now = T0 + timedelta(seconds=step)
        got = await _fire(store, firsts, now)
        assert got == {r.id for r in firsts if r.fire_at <= now} - fired
        fired |= got
    assert fired == {r.id for r in firsts}

    nexts = [r for r in await _all_runs(store, tenant.id) if r.state.value == "SCHEDULED"]
    hour = T0 + timedelta(hours=1)
    assert len(nexts) == 1000 and {r.due_at for r in nexts} == {hour}
    buckets = [0] * 10
    for r in nexts:
        assert r.fire_at == _expected(r, 600)
        buckets[int((r.fire_at - hour).total_seconds() // 60)] += 1
    assert min(buckets) >= 50 and max(buckets) <= 150, buckets  # 100 ± 5 sd
    # A run's reason says nothing of lateness: each went out within 30 s of its instant.
    assert all(r.reason is None for r in await _all_runs(store, tenant.id) if r.due_at == T0)


async def _all_runs(store: Store, tenant_id: uuid.UUID) -> list[Run]:
    out: list[Run] = []
    cursor: str | None = None
    while True:
        page = await store.runs_list(tenant_id, limit=500, cursor=cursor)
        out += page.items
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def test_two_store_instances_agree_on_every_spread_instant(
    store: Store, store_url: str
) -> None:
    """Occurrences materialised by one store instance and by another (the node
    restarted, or another process) fire at the same instants."""
    tenant = await make_tenant(store)
    [first] = await _create(store, tenant.id, _spec({"interval": 300}, 299.5))
    other = create_store(store_url)
    await other.open()
    try:
        run = first
        for i in range(6):
            node_store = store if i % 2 == 0 else other
            assert await _fire(node_store, [run], run.fire_at) == {run.id}
            run = next(r for r in await _runs(store, first) if r.state.value == "SCHEDULED")
            assert run.due_at == first.due_at + timedelta(seconds=300 * (i + 1))
            assert run.fire_at == _expected(run, 299.5)
            assert (await other.runs_get(tenant.id, run.id)).fire_at == run.fire_at
    finally:
        await other.close()


async def test_overlap_reads_the_spread_instant(store: Store) -> None:
    """overlap=skip: at the next occurrence's due instant the previous run is still
    going, but the occurrence fires only at its spread instant, when it has ended."""
    tenant = await make_tenant(store)
    spec = _spec({"cron": "*/5 * * * *", "overlap": "skip"}, 240)
    [first, other] = await _create(store, tenant.id, spec, count=2)
    worker = await store.workers_register(
        None, pool="default", capabilities=[], tags=[], capacity=2, now=T0
    )
    for run in (first, other):
        assert await _fire(store, [run], run.fire_at) == {run.id}
    latest = max(first.fire_at, other.fire_at)
    leased = {a.run_id: a for a in await store.attempts_lease(worker=worker, max=2, now=latest)}
    assert set(leased) == {first.id, other.id}
    second = (await _runs(store, first))[1]
    third = (await _runs(store, other))[1]
    assert second.due_at == third.due_at == T0 + timedelta(minutes=5)
    assert second.fire_at == _expected(second, 240) > second.due_at

    # At the nominal instant nothing fires: the previous runs are still going.
    assert await _fire(store, [second, third], second.due_at) == set()
    assert [r.state.value for r in await _runs(store, first)] == ["RUNNING", "SCHEDULED"]

    # ``first`` ends before its successor's spread instant, ``other`` does not.
    a = leased[first.id]
    ended = second.due_at + (second.fire_at - second.due_at) / 2
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token)], now=ended
    )
    assert done.ok
    assert await _fire(store, [second], second.fire_at) == {second.id}
    assert await _fire(store, [third], third.fire_at) == set()
    states = [(r.state.value, r.reason) for r in await _runs(store, other)]
    assert states[1] == ("SKIPPED", "the previous run is still going (overlap=skip)")


async def test_catch_up_replays_the_occurrences_whose_spread_instant_passed(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    spec = _spec({"interval": 60, "catch_up": "replay", "catch_up_window": 3600}, 50)
    [first] = await _create(store, tenant.id, spec)
    now = T0 + timedelta(minutes=10, seconds=20)
    assert await _fire(store, [first], now) == {first.id}
    runs = await _runs(store, first)
    dues = [T0 + timedelta(minutes=k) for k in range(1, 12)]
    passed = [d for d in dues if spread_instant(first.job_id, d, 50) <= now]
    ahead = next(d for d in dues if spread_instant(first.job_id, d, 50) > now)
    assert passed == dues[: len(passed)]  # in order: the spread is shorter than the interval
    assert [(r.state.value, r.origin, r.due_at) for r in runs] == [
        ("DISPATCHED", "schedule", T0),
        *[("DISPATCHED", "replay", d) for d in passed],
        ("SCHEDULED", "schedule", ahead),
    ]
    for r in runs:  # every one of them at its own spread instant, replays included
        assert r.fire_at == _expected(r, 50)
    assert "replayed" in (runs[0].reason or "")


async def test_pause_and_resume_keep_the_spread_instant(store: Store) -> None:
    tenant = await make_tenant(store)
    [run] = await _create(store, tenant.id, _spec({"cron": "0 * * * *"}, 1800))
    await store.jobs_pause(tenant.id, run.job_id, now=T0)
    assert (await store.runs_get(tenant.id, run.id)).fire_at == PARKED_FIRE_AT
    await store.jobs_resume(tenant.id, run.job_id, now=T0)
    resumed = await store.runs_get(tenant.id, run.id)
    assert resumed.fire_at == run.fire_at == _expected(run, 1800) > run.due_at


async def test_a_one_off_job_fires_inside_its_spread(store: Store) -> None:
    tenant = await make_tenant(store)
    at = T0 + timedelta(hours=1)
    [run] = await _create(store, tenant.id, _spec({"at": at.isoformat()}, 900))
    assert run.due_at == at and run.fire_at == _expected(run, 900)
    assert at < run.fire_at < at + timedelta(seconds=900)
    assert await _fire(store, [run], at) == set()
    assert await _fire(store, [run], run.fire_at) == {run.id}


async def test_one_batch_fires_each_spread_run_by_its_own_instant(store: Store) -> None:
    """Runs of one schedule and due instant fired in one batch: those fired within the
    grace of their spread instants go out on time, the others are late (coalesced),
    whatever the batch's order: their plans are not mixed up."""
    tenant = await make_tenant(store)
    spec = _spec({"interval": 300}, 200)
    firsts = sorted(await _create(store, tenant.id, spec, count=20), key=lambda r: r.fire_at)
    # The earliest run is missed at the instant of one more than 60 s after it.
    now = next(r.fire_at for r in firsts if r.fire_at - firsts[0].fire_at > timedelta(seconds=60))
    batch = [r for r in firsts if r.fire_at <= now]
    assert await _fire(store, batch[::-1], now) == {r.id for r in batch}
    for r in batch:
        fired = await store.runs_get(tenant.id, r.id)
        if now - r.fire_at > timedelta(seconds=60):
            assert "late by" in (fired.reason or "") and "coalesce" in (fired.reason or "")
        else:
            assert fired.reason is None
    assert any(now - r.fire_at > timedelta(seconds=60) for r in batch)
    scheduled = [r for r in await _all_runs(store, tenant.id) if r.state.value == "SCHEDULED"]
    nexts = sorted(r.job_id for r in scheduled if r.due_at == T0 + timedelta(seconds=300))
    assert nexts == sorted(r.job_id for r in batch)  # each fired run's next, and no other
    assert {r.id for r in scheduled if r.due_at == T0} == {r.id for r in firsts[len(batch) :]}
