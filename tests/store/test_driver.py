"""Driver conformance: every statement of ``store/driver.py``, called directly on each
driver (SQLite and PostgreSQL) inside one transaction, answers the same.

The store suite runs the drivers through the store's logic; these tests hold each
driver method to its contract on its own, so a driver that answers differently fails
here, named, rather than somewhere above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import NotFoundError
from cronwheel.domain.model import FiredRun, Job, LeasedAttempt, NewJob, Run, Worker
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import CHANNEL_RUNS_NEW, CompleteItem, HeartbeatItem, RunFilter, Store
from cronwheel.store.driver import (
    CreatedRun,
    Driver,
    FireCandidate,
    NewJobRows,
    PlannedRun,
    WorkerGone,
)
from cronwheel.store.drivers.postgres_jobs import COPY_FROM
from cronwheel.store.notices import parse_announcement
from cronwheel.store.rows import event_row
from cronwheel.store.schema import NUM_SHARDS, runs
from cronwheel.store.sql import SqlStore
from cronwheel.store.sql.jobs import _NewJobs, _request_hash
from cronwheel.store.values import Grant
from cronwheel.testing import wait_until_async

from .helpers import (
    NODE,
    T0,
    at,
    create_job,
    create_jobs,
    dispatched_run,
    events_of,
    hold_all_shards,
    make_tenant,
    new_job,
    register_worker,
)


def _driver(store: Store) -> Driver:
    assert isinstance(store, SqlStore)
    return store.driver


@contextlib.asynccontextmanager
async def _tx(store: Store) -> AsyncIterator[AsyncConnection]:
    driver = _driver(store)
    assert isinstance(store, SqlStore)
    async with driver.begin_write(store.engine) as conn:
        yield conn


async def _lease(
    driver: Driver,
    conn: AsyncConnection,
    *,
    worker: Worker,
    max: int,
    ahead: float,
    now: datetime,
) -> list[LeasedAttempt]:
    """Read the ready queue, grant all of it (up to ``max`` per tenant), lease."""
    queue = await driver.ready_queue(
        conn, worker=worker, max=max, webhooks_only=False, ahead=ahead, now=now
    )
    grants = [
        Grant(tenant_id, priority, n)
        for tenant_id, classes in queue.supply.items()
        for priority, n in classes.items()
    ]
    leased, got = await driver.attempts_lease(
        conn, worker=worker, grants=grants, webhooks_only=False, ahead=ahead, now=now
    )
    assert sum(got.values()) == len(leased)
    return leased


async def test_fencing_tokens_only_grow(store: Store) -> None:
    async with _tx(store) as conn:
        first = await _driver(store).fencing_tokens(conn, 3)
        second = await _driver(store).fencing_tokens(conn, 2)
    assert len(set(first)) == 3 and first == sorted(first)
    assert min(second) > max(first)


async def test_expression_hooks_mean_the_same_on_every_driver(store: Store) -> None:
    tenant = await make_tenant(store)
    a, b = await create_jobs(store, tenant.id, 2, requires=["gpu", "ssd"], tags=["red"])
    [c] = await create_jobs(store, tenant.id, 1, requires=[], tags=["blue"])
    driver = _driver(store)

    async def ids(where: sa.ColumnElement[bool]) -> set[uuid.UUID]:
        async with _tx(store) as conn:
            rows = await conn.execute(
                sa.select(runs.c.id).where(runs.c.tenant_id == tenant.id, where)
            )
            return {r.id for r in rows}

    assert await ids(driver.id_in(runs.c.id, [a.id, c.id])) == {a.id, c.id}
    assert await ids(driver.id_in(runs.c.id, [])) == set()
    assert await ids(driver.json_has(runs.c.tags, "red")) == {a.id, b.id}
    assert await ids(driver.json_subset(runs.c.requires, ["gpu"])) == {c.id}
    assert await ids(driver.json_subset(runs.c.requires, ["ssd", "gpu", "x"])) == {a.id, b.id, c.id}
    assert await ids(driver.json_equals(runs.c.requires, ("gpu", "ssd"))) == {a.id, b.id}
    assert await ids(driver.starts_with(runs.c.job_name, "no such")) == set()


async def test_events_insert_appends_rows(store: Store) -> None:
    tenant = await make_tenant(store)
    [run] = await create_jobs(store, tenant.id, 1)
    row = event_row(
        at=T0,
        kind="run.note",
        tenant_id=tenant.id,
        job_id=run.job_id,
        run_id=run.id,
        actor="test",
        data={"n": 1},
    )
    async with _tx(store) as conn:
        await _driver(store).events_insert(conn, [row, row | {"data": None}])
    page = await store.events_list(tenant.id, run_id=run.id)
    notes = [e for e in page.items if e.kind == "run.note"]
    assert [(e.actor, e.data) for e in notes] == [("test", {"n": 1}), ("test", {})]


async def test_runs_fire_is_fenced_and_bounded_by_the_lead(store: Store) -> None:
    tenant = await make_tenant(store)
    now_run, soon, later = [
        (await create_jobs(store, tenant.id, 1, due_at=due))[0] for due in (T0, at(2), at(60))
    ]
    epochs = await hold_all_shards(store)
    driver = _driver(store)
    ids = [now_run.id, soon.id, later.id]
    async with _tx(store) as conn:
        # Another node fires nothing; a stale epoch fires nothing.
        assert (
            await driver.runs_fire(conn, run_ids=ids, node_id="other", at=T0, lead=5, epochs=None)
            == []
        )
        stale = {shard: epoch - 1 for shard, epoch in epochs.items()}
        assert (
            await driver.runs_fire(conn, run_ids=ids, node_id=NODE, at=T0, lead=5, epochs=stale)
            == []
        )
        fired = await driver.runs_fire(
            conn, run_ids=ids, node_id=NODE, at=T0, lead=5, epochs=epochs
        )
    assert all(isinstance(f, FiredRun) for f in fired)
    assert {f.id for f in fired} == {now_run.id, soon.id}
    assert {f.dispatched_at for f in fired} == {T0}
    assert (await store.runs_get(tenant.id, later.id)).state is RunState.SCHEDULED
    assert (await store.runs_get(tenant.id, soon.id)).state is RunState.DISPATCHED


async def test_recurring_first_tries_are_candidates_not_plain_fires(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(store, tenant.id, due_at=T0, schedule={"cron": "0 * * * *"})
    await hold_all_shards(store)
    driver = _driver(store)
    fence = {"run_ids": [run.id], "node_id": NODE, "at": T0, "lead": 0.0, "epochs": None}
    async with _tx(store) as conn:
        assert await driver.runs_fire(conn, **fence) == []  # type: ignore[arg-type]
        [candidate] = await driver.runs_fire_candidates(conn, **fence)  # type: ignore[arg-type]
    assert isinstance(candidate, FireCandidate)
    assert (candidate.id, candidate.job_id, candidate.shard) == (run.id, job.id, run.shard)
    assert candidate.job_state == JobState.ACTIVE.value
    assert candidate.schedule["cron"] == "0 * * * *"

    planned = PlannedRun(
        source=run.id,
        id=uuid.uuid4(),
        due_at=T0 + timedelta(hours=1),
        due_local=None,
        state=RunState.SCHEDULED.value,
        origin="schedule",
        reason=None,
    )
    async with _tx(store) as conn:
        created = await driver.runs_insert_planned(
            conn, planned=[planned], sources={run.id: candidate}, at=T0, node_id=NODE
        )
    assert created == [
        CreatedRun(
            id=planned.id,
            tenant_id=tenant.id,
            job_id=job.id,
            state="SCHEDULED",
            reason=None,
            shard=run.shard,
            fire_at=planned.due_at,
            pool=run.pool,
        )
    ]
    # The same occurrence again (another id): it exists, nothing is created.
    again = PlannedRun(**{**_fields(planned), "id": uuid.uuid4()})
    async with _tx(store) as conn:
        assert (
            await driver.runs_insert_planned(
                conn, planned=[again], sources={run.id: candidate}, at=T0, node_id=NODE
            )
            == []
        )


def _fields(p: PlannedRun) -> dict[str, object]:
    return {name: getattr(p, name) for name in PlannedRun.__dataclass_fields__}


async def test_lease_start_heartbeat_and_complete(store: Store) -> None:
    tenant = await make_tenant(store)
    due = await dispatched_run(store, tenant.id, now=T0)
    worker = await register_worker(store, tenant.id, pool=due.pool)
    driver = _driver(store)
    async with _tx(store) as conn:
        [leased] = await _lease(driver, conn, worker=worker, max=10, ahead=0, now=at(1))
    assert isinstance(leased, LeasedAttempt)
    assert (leased.run_id, leased.number, leased.not_before) == (due.id, 1, None)
    assert leased.lease_expires_at == at(1) + timedelta(seconds=due.heartbeat_timeout)

    beat = HeartbeatItem(leased.attempt_id, leased.fencing_token, progress=True, details={"p": 1})
    stale = HeartbeatItem(leased.attempt_id, leased.fencing_token + 1)
    async with _tx(store) as conn:
        beaten = await driver.attempts_heartbeat(
            conn, items=[beat, stale], tenant_id=tenant.id, now=at(2)
        )
    key = (leased.attempt_id, leased.fencing_token)
    assert list(beaten) == [key]
    assert beaten[key].lease_expires_at == at(2) + timedelta(seconds=due.heartbeat_timeout)
    assert beaten[key].run_state is RunState.RUNNING
    [attempt] = await store.attempts_list(tenant.id, run_id=due.id)
    assert attempt.progress_details == {"p": 1}

    async with _tx(store) as conn:
        # Another tenant's worker completes nothing of this tenant's.
        assert (
            await driver.attempts_complete(
                conn,
                items=[CompleteItem(*key, result={"ok": True})],
                tenant_id=uuid.uuid4(),
                now=at(3),
            )
            == {}
        )
        done = await driver.attempts_complete(
            conn, items=[CompleteItem(*key, result={"ok": True})], tenant_id=tenant.id, now=at(3)
        )
    assert done[key].ok and done[key].run_state is RunState.SUCCESS
    run = await store.runs_get(tenant.id, due.id)
    assert (run.state, run.result, run.finished_at) == (RunState.SUCCESS, {"ok": True}, at(3))
    assert (await store.jobs_get(tenant.id, run.job_id)).state is JobState.FINISHED


async def test_reservations_start_at_their_instant(store: Store) -> None:
    tenant = await make_tenant(store)
    [run] = await create_jobs(store, tenant.id, 1, due_at=at(3))
    await hold_all_shards(store)
    assert await store.runs_fire(run_ids=[run.id], node_id=NODE, now=T0, lead=5)
    worker = await register_worker(store, tenant.id, pool=run.pool)
    driver = _driver(store)
    async with _tx(store) as conn:
        assert (
            await _lease(driver, conn, worker=worker, max=10, ahead=0, now=T0) == []
        )  # not leasable before its instant without asking ahead
        [reserved] = await _lease(driver, conn, worker=worker, max=10, ahead=5, now=T0)
    assert reserved.not_before == at(3)
    token = reserved.fencing_token
    async with _tx(store) as conn:
        early = await driver.attempts_start(
            conn,
            worker_id=worker.id,
            tokens=[token, token + 99],
            tenant_id=None,
            now=at(1),
            ahead=1.5,
        )
        started = await driver.attempts_start(
            conn, worker_id=worker.id, tokens=[token], tenant_id=None, now=at(2.5), ahead=1.5
        )
    assert (early.started, early.not_yet, early.refused) == ([], [token], [token + 99])
    # Started half a second ahead: it begins at its instant.
    assert (started.started_at, started.started, started.first_tries) == (
        at(3),
        [token],
        [(run.due_at, at(3), tenant.id, run.priority)],
    )
    [attempt] = await store.attempts_list(tenant.id, run_id=run.id)
    assert (attempt.id, attempt.fencing_token) == (reserved.attempt_id, token)


async def test_a_worker_not_live_leases_and_starts_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    await dispatched_run(store, tenant.id, now=T0)
    worker = await register_worker(store, tenant.id)
    await store.workers_deregister(worker.id, now=T0)
    ghost = dataclasses.replace(worker, id=uuid.uuid4())  # no such worker at all
    driver = _driver(store)
    for who in [worker, ghost]:
        async with _tx(store) as conn:
            try:
                await _lease(driver, conn, worker=who, max=1, ahead=0, now=at(1))
            except WorkerGone as gone:
                assert gone.worker_id == who.id
            else:
                raise AssertionError("a worker that is not live leased")
        async with _tx(store) as conn:
            try:
                await driver.attempts_start(
                    conn, worker_id=who.id, tokens=[1], tenant_id=None, now=at(1), ahead=0.0
                )
            except WorkerGone as gone:
                assert gone.worker_id == who.id
            else:
                raise AssertionError("a worker that is not live started")


async def test_shard_leases_renew_shares_the_shards(store: Store) -> None:
    # The rows exist once the store's first renewal seeded them.
    alone = await store.scheduler_renew(node_id="a", ttl=10, shards=NUM_SHARDS, now=T0)
    assert (alone.live, alone.share, len(alone.held)) == (1, NUM_SHARDS, NUM_SHARDS)
    driver = _driver(store)
    assert isinstance(store, SqlStore)
    async with driver.begin_renewal(store.engine) as conn:
        second = await driver.shard_leases_renew(
            conn, node_id="b", ttl=10, shards=NUM_SHARDS, now=at(1)
        )
    # b counts two nodes but takes nothing a live lease holds.
    assert (second.live, second.share, second.held) == (2, NUM_SHARDS // 2, {})
    assert second.others_expire_at == T0 + timedelta(seconds=10)
    async with driver.begin_renewal(store.engine) as conn:
        # a fell silent past the TTL and its leases ran out: b, alone now, takes them
        # all, each under a new epoch.
        taken = await driver.shard_leases_renew(
            conn, node_id="b", ttl=10, shards=NUM_SHARDS, now=at(11)
        )
    assert (taken.live, len(taken.held)) == (1, NUM_SHARDS)
    assert all(taken.held[s] == alone.held[s] + 1 for s in taken.held)


async def test_lease_takes_only_the_workers_tasks_and_route_tags(store: Store) -> None:
    tenant = await make_tenant(store)
    mine = await dispatched_run(store, tenant.id, task="mine", route_tags=["red"])
    await dispatched_run(store, tenant.id, task="theirs")
    await dispatched_run(store, tenant.id, task="mine", route_tags=["red", "eu"])
    worker = await register_worker(store, tenant.id, tasks=["mine"], tags=["red", "blue"])
    driver = _driver(store)
    async with _tx(store) as conn:
        leased = await _lease(driver, conn, worker=worker, max=10, ahead=0, now=at(1))
    assert [a.run_id for a in leased] == [mine.id]


def _new_job_rows(
    tenant_id: uuid.UUID, jobs: list[NewJob]
) -> tuple[NewJobRows, list[tuple[Job, Run | None]]]:
    """The rows the store would hand ``jobs_insert`` for ``jobs`` created at ``T0``,
    with the records it builds from them."""
    made, records = _new_jobs(tenant_id, jobs)
    return made.rows(), records


def _new_jobs(
    tenant_id: uuid.UUID, jobs: list[NewJob]
) -> tuple[_NewJobs, list[tuple[Job, Run | None]]]:
    made = _NewJobs(tenant_id, T0)
    added = [made.add(nj, _request_hash(nj)) for nj in jobs]
    return made, [(a.job, a.run_record()) for a in added]


# A batch this large goes to PostgreSQL by COPY, a smaller one in one statement: every
# test of ``jobs_insert`` runs both ways.
_BATCH_SIZES = pytest.mark.parametrize("count", [1, COPY_FROM], ids=["statement", "copy"])


def _batch(count: int, name: str, **fields: Any) -> list[NewJob]:
    return [new_job(name=f"{name}-{i}", **fields) for i in range(count)]


@_BATCH_SIZES
async def test_jobs_insert_writes_jobs_runs_events_and_the_notices_follow(
    store: Store, count: int
) -> None:
    tenant = await make_tenant(store)
    made, records = _new_jobs(
        tenant.id,
        [new_job(name="first", due_at=T0), new_job(name="second", due_at=at(5))]
        + [new_job(name=f"more-{i}", due_at=at(i), payload={"n": i}) for i in range(count - 1)],
    )
    assert isinstance(store, SqlStore)
    sub = store.subscribe(CHANNEL_RUNS_NEW)
    if store.dialect == "postgresql":
        # Notices go out on the connection that listens: once it is up, none is lost.
        await wait_until_async(
            lambda: getattr(_driver(store), "_notifying", None) is not None,
            10,
            what="the LISTEN connection",
        )
    try:
        async with store._write() as conn:
            done = await _driver(store).jobs_insert(
                conn, tenant_id=tenant.id, rows=made.rows(), admitted=False
            )
        assert done == "inserted"
        # The caller sends the notices once the rows have committed.
        _driver(store).notify_committed(CHANNEL_RUNS_NEW, made.notices, store._deliver)
        heard: list[str] = []
        for _ in range(50):  # PostgreSQL delivers through LISTEN, a moment later
            heard += [p for chunk in await sub.wait(0.1) for p in chunk.split("\n")]
            if len(heard) >= len(records):
                break
    finally:
        sub.close()
    for job, run in records:
        assert run is not None
        assert await store.jobs_get(tenant.id, job.id) == job
        stored = await store.runs_get(tenant.id, run.id)
        assert stored == run
        assert (stored.job_id, stored.state, stored.due_at) == (
            job.id,
            RunState.SCHEDULED,
            run.due_at,
        )
        assert [
            (e.from_state, e.to_state) for e in await events_of(store, tenant.id, run_id=run.id)
        ] == [(None, RunState.SCHEDULED.value)]
    assert sorted(parse_announcement(p).id for p in heard) == sorted(
        run.id for _job, run in records if run is not None
    )


async def test_jobs_insert_of_jobs_without_runs(store: Store) -> None:
    tenant = await make_tenant(store)
    made, [(job, run)] = _new_jobs(tenant.id, [new_job(name="later", due_at=None)])
    rows = made.rows()
    assert run is None and rows.runs == [] and made.notices == []
    async with _tx(store) as conn:
        assert (
            await _driver(store).jobs_insert(conn, tenant_id=tenant.id, rows=rows, admitted=False)
            == "inserted"
        )
    assert (await store.jobs_get(tenant.id, job.id)).next_due_at is None
    assert (await store.runs_list(tenant.id, filter=RunFilter(job_id=job.id))).items == []


@_BATCH_SIZES
async def test_jobs_insert_for_no_tenant_inserts_nothing(store: Store, count: int) -> None:
    tenant = await make_tenant(store)
    ghost = uuid.uuid4()
    rows, [(job, _run), *_] = _new_job_rows(ghost, _batch(count, "orphan"))
    async with _tx(store) as conn:
        assert (
            await _driver(store).jobs_insert(conn, tenant_id=ghost, rows=rows, admitted=False)
            == "no_tenant"
        )
    assert (await store.jobs_list(tenant.id)).items == []
    with pytest.raises(NotFoundError):
        await store.jobs_get(ghost, job.id)


@_BATCH_SIZES
async def test_jobs_insert_leaves_a_limited_tenant_to_its_caller(store: Store, count: int) -> None:
    tenant = await make_tenant(store, max_pending_runs=10)
    rows, records = _new_job_rows(tenant.id, _batch(count, "limited"))
    driver = _driver(store)
    async with _tx(store) as conn:
        done = await driver.jobs_insert(conn, tenant_id=tenant.id, rows=rows, admitted=False)
    assert done == "limited"
    assert (await store.jobs_list(tenant.id)).items == []
    # The caller counted the tenant's pending runs in its transaction: admitted.
    async with _tx(store) as conn:
        done = await driver.jobs_insert(conn, tenant_id=tenant.id, rows=rows, admitted=True)
    assert done == "inserted"
    listed = (await store.jobs_list(tenant.id, limit=500)).items
    assert sorted(j.id for j in listed) == sorted(job.id for job, _run in records)


@_BATCH_SIZES
async def test_jobs_insert_alone_is_a_transaction_of_its_own(store: Store, count: int) -> None:
    tenant = await make_tenant(store)
    limited = await make_tenant(store, max_pending_runs=10)
    driver = _driver(store)
    rows, records = _new_job_rows(tenant.id, _batch(count, "alone"))
    done = await driver.jobs_insert_alone(store.engine, tenant_id=tenant.id, rows=rows)
    assert done == "inserted"
    listed = (await store.jobs_list(tenant.id, limit=500)).items
    assert sorted(j.id for j in listed) == sorted(job.id for job, _run in records)
    rows, _ = _new_job_rows(limited.id, _batch(count, "limited"))
    done = await driver.jobs_insert_alone(store.engine, tenant_id=limited.id, rows=rows)
    assert done == "limited"
    assert (await store.jobs_list(limited.id)).items == []
    ghost = uuid.uuid4()
    rows, _ = _new_job_rows(ghost, _batch(count, "orphan"))
    done = await driver.jobs_insert_alone(store.engine, tenant_id=ghost, rows=rows)
    assert done == "no_tenant"


async def _parts(
    rows: list[NewJobRows], fail_after: int | None = None
) -> AsyncIterator[NewJobRows]:
    """``rows`` one part at a time, letting the loop run between them as the store's
    maker does; raising once ``fail_after`` parts were read."""
    for index, part in enumerate(rows):
        if index == fail_after:
            raise RuntimeError("the maker failed")
        await asyncio.sleep(0)
        yield part


async def test_jobs_insert_alone_takes_rows_in_parts(store: Store) -> None:
    tenant = await make_tenant(store)
    driver = _driver(store)
    parts = [_new_job_rows(tenant.id, _batch(COPY_FROM, f"part{p}")) for p in range(3)]
    done = await driver.jobs_insert_alone(
        store.engine, tenant_id=tenant.id, rows=_parts([rows for rows, _ in parts])
    )
    assert done == "inserted"
    for _rows, records in parts:
        for job, run in records:
            assert await store.jobs_get(tenant.id, job.id) == job
            assert run is not None and await store.runs_get(tenant.id, run.id) == run
    limited = await make_tenant(store, max_pending_runs=10)
    rows, _ = _new_job_rows(limited.id, _batch(COPY_FROM, "limited"))
    done = await driver.jobs_insert_alone(store.engine, tenant_id=limited.id, rows=_parts([rows]))
    assert done == "limited"
    assert (await store.jobs_list(limited.id)).items == []
    ghost = uuid.uuid4()
    rows, _ = _new_job_rows(ghost, _batch(COPY_FROM, "orphan"))
    done = await driver.jobs_insert_alone(store.engine, tenant_id=ghost, rows=_parts([rows]))
    assert done == "no_tenant"


@pytest.mark.parametrize("failure", ["a later part is refused", "the maker fails"])
async def test_jobs_insert_alone_in_parts_is_all_or_nothing(store: Store, failure: str) -> None:
    tenant = await make_tenant(store)
    driver = _driver(store)
    first, _ = _new_job_rows(tenant.id, _batch(COPY_FROM, "first"))
    second, _ = _new_job_rows(tenant.id, _batch(COPY_FROM, "second"))
    if failure == "a later part is refused":
        # The third part's first job has the first part's first job's id.
        third, _ = _new_job_rows(tenant.id, _batch(COPY_FROM, "third"))
        clash = (first.jobs[0][0], *third.jobs[0][1:])
        third = dataclasses.replace(third, jobs=[clash, *third.jobs[1:]], runs=[], events=[])
        parts = _parts([first, second, third])
    else:
        parts = _parts([first, second, first], fail_after=2)
    with pytest.raises(Exception) as raised:
        await driver.jobs_insert_alone(store.engine, tenant_id=tenant.id, rows=parts)
    if failure == "the maker fails":
        assert str(raised.value) == "the maker failed"
    else:
        assert driver.integrity_error(raised.value) is not None
    # Nothing of the first two parts was kept, and the store still works.
    assert (await store.jobs_list(tenant.id)).items == []
    events = (await store.events_list(tenant.id, limit=1000)).items
    assert [e for e in events if e.job_id is not None] == []
    done = await driver.jobs_insert_alone(store.engine, tenant_id=tenant.id, rows=_parts([second]))
    assert done == "inserted"
    assert len((await store.jobs_list(tenant.id, limit=500)).items) == COPY_FROM


async def test_jobs_insert_alone_in_parts_cancelled_midway_keeps_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    driver = _driver(store)
    first, _ = _new_job_rows(tenant.id, _batch(COPY_FROM, "first"))
    second, _ = _new_job_rows(tenant.id, _batch(COPY_FROM, "second"))
    read, never = asyncio.Event(), asyncio.Event()

    async def parts() -> AsyncIterator[NewJobRows]:
        yield first
        read.set()
        await never.wait()  # the caller goes away while the first part is copied
        yield second

    task = asyncio.create_task(
        driver.jobs_insert_alone(store.engine, tenant_id=tenant.id, rows=parts())
    )
    await asyncio.wait_for(read.wait(), 10)
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()
    assert (await store.jobs_list(tenant.id)).items == []
    done = await driver.jobs_insert_alone(store.engine, tenant_id=tenant.id, rows=_parts([second]))
    assert done == "inserted"
    assert len((await store.jobs_list(tenant.id, limit=500)).items) == COPY_FROM


@_BATCH_SIZES
async def test_integrity_error_names_the_broken_unique_key(store: Store, count: int) -> None:
    tenant = await make_tenant(store)
    driver = _driver(store)
    first, _ = _new_job_rows(tenant.id, [new_job(name="a", idempotency_key="same")])
    # The key used again by the last job of the batch.
    second, _ = _new_job_rows(
        tenant.id,
        [*_batch(count - 1, "bystander"), new_job(name="b", idempotency_key="same")],
    )
    async with _tx(store) as conn:
        await driver.jobs_insert(conn, tenant_id=tenant.id, rows=first, admitted=False)
    with pytest.raises(Exception) as raised:
        async with _tx(store) as conn:
            await driver.jobs_insert(conn, tenant_id=tenant.id, rows=second, admitted=False)
    broken = driver.integrity_error(raised.value)
    assert broken is not None and "idempotency" in broken.lower()
    # Nothing of the refused statement was stored.
    assert [j.name for j in (await store.jobs_list(tenant.id)).items] == ["a"]
    # Anything else is not a broken constraint.
    assert driver.integrity_error(ValueError("no")) is None
    assert driver.integrity_error(OSError("connection refused")) is None
