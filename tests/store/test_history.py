"""The run history: every filter, keyset pages that runs added meanwhile never shift,
every tenant's runs for the admin, cursors, and (PostgreSQL) each listing one index
range walked backwards, never a sort of a tenant's runs."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Run
from cronwheel.store import FailItem, RunFilter, Store
from cronwheel.store.rows import history_cursor, history_position
from cronwheel.store.schema import runs

from .helpers import (
    T0,
    at,
    create_job,
    engine_of,
    fire,
    leased_run,
    make_tenant,
    new_job,
)

POOLS = ("default", "gpu", "etl")
TAGS = ("red", "blue", "green")


async def _history(store: Store, tenant_id: uuid.UUID | None, count: int, seed: int) -> list[Run]:
    """``count`` one-off jobs of the tenant in one batch, with a spread of due instants
    (several runs due at each instant), pools and tags; a third of them fired."""
    rnd = random.Random(seed)
    jobs = [
        new_job(
            due_at=at(rnd.randrange(0, count // 3 + 1) * 60),
            pool=rnd.choice(POOLS),
            tags=rnd.sample(TAGS, rnd.randrange(0, 3)),
        )
        for _ in range(count)
    ]
    assert tenant_id is not None
    made = await store.jobs_create_many(tenant_id, jobs=jobs, now=T0)
    created = [run for _job, run, _ in made if run is not None]
    fired = await fire(store, created[::3], now=at(count * 60))
    fired_ids = {f.id for f in fired}
    return [r if r.id not in fired_ids else await store.runs_get(tenant_id, r.id) for r in created]


def _order(items: list[Run]) -> list[uuid.UUID]:
    return [r.id for r in sorted(items, key=lambda r: (r.due_at, r.id), reverse=True)]


async def _walk(
    store: Store, tenant_id: uuid.UUID | None, limit: int, **filters: Any
) -> list[uuid.UUID]:
    seen: list[uuid.UUID] = []
    cursor: str | None = None
    while True:
        page = await store.runs_list(
            tenant_id, filter=RunFilter(**filters), cursor=cursor, limit=limit
        )
        assert len(page.items) <= limit
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            return seen
        assert len(page.items) == limit
        cursor = page.next_cursor


async def test_every_filter_pages_in_order(store: Store) -> None:
    tenant = await make_tenant(store)
    made = await _history(store, tenant.id, 120, seed=1)
    job = made[7]
    cases: list[tuple[dict[str, Any], list[Run]]] = [
        ({}, made),
        ({"job_id": job.job_id}, [job]),
        ({"job_id": uuid.uuid4()}, []),
        ({"states": ["DISPATCHED"]}, [r for r in made if r.state.value == "DISPATCHED"]),
        ({"states": ["SCHEDULED", "DISPATCHED"]}, made),
        ({"states": ["SUCCESS"]}, []),
        ({"since": at(600)}, [r for r in made if r.due_at >= at(600)]),
        ({"until": at(600)}, [r for r in made if r.due_at < at(600)]),
        (
            {"since": at(600), "until": at(1200)},
            [r for r in made if at(600) <= r.due_at < at(1200)],
        ),
        ({"tags": ["red"]}, [r for r in made if "red" in r.tags]),
        ({"tags": ["red", "blue"]}, [r for r in made if {"red", "blue"} <= set(r.tags)]),
        ({"tags": ["re"]}, []),
        ({"pool": "gpu"}, [r for r in made if r.pool == "gpu"]),
        ({"pool": "nope"}, []),
        (
            {"pool": "etl", "states": ["SCHEDULED"], "since": at(300)},
            [
                r
                for r in made
                if r.pool == "etl" and r.state.value == "SCHEDULED" and r.due_at >= at(300)
            ],
        ),
        (
            {"tags": ["green"], "states": ["DISPATCHED", "SCHEDULED"], "until": at(1500)},
            [r for r in made if "green" in r.tags and r.due_at < at(1500)],
        ),
    ]
    for filters, expected in cases:
        for limit in (1, 7, 500):
            assert await _walk(store, tenant.id, limit, **filters) == _order(expected), (
                filters,
                limit,
            )
    # The cases do pick out subsets: the data has a spread of each.
    assert 0 < len([r for r in made if r.pool == "gpu"]) < len(made)
    assert len({r.due_at for r in made}) < len(made)  # ties in due_at, broken by id


async def test_pages_stay_put_while_runs_are_added(store: Store) -> None:
    """Runs added between pages — newer ones at the top, older ones among the pages not
    read yet — never shift a page: no run read twice, none of those there at the start
    missed, and the newer ones not seen at all."""
    tenant = await make_tenant(store)
    made = await _history(store, tenant.id, 60, seed=2)
    expected = _order(made)
    seen: list[uuid.UUID] = []
    added_below: list[uuid.UUID] = []
    added_above: set[uuid.UUID] = set()
    cursor: str | None = None
    step = 0
    while True:
        page = await store.runs_list(tenant.id, cursor=cursor, limit=7)
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        step += 1
        last = page.items[-1]
        # One newer than everything, one due just after the page (already passed),
        # and one due well before the page's end (still ahead of the walk).
        batch = [
            new_job(due_at=at(10_000 + step * 60)),
            new_job(due_at=last.due_at + (at(1) - at(0))),
            new_job(due_at=last.due_at - (at(600) - at(0))),
        ]
        made_now = await store.jobs_create_many(tenant.id, jobs=batch, now=T0)
        ids = [run.id for _job, run, _ in made_now if run is not None]
        added_above.update(ids[:2])
        added_below.append(ids[2])
    assert len(seen) == len(set(seen))
    assert not added_above & set(seen)
    assert [i for i in seen if i in set(expected)] == expected
    assert set(added_below) <= set(seen)  # due below the cursor: reached in order


async def test_pages_stay_put_while_a_writer_adds_runs_concurrently(store: Store) -> None:
    """The same with a writer running beside the reader, adding runs at the top and
    below the whole history, as fast as it can, until the reader is done."""
    tenant = await make_tenant(store)
    made = await _history(store, tenant.id, 80, seed=6)
    expected = _order(made)
    done = asyncio.Event()
    added_top: set[uuid.UUID] = set()
    added_below: dict[uuid.UUID, datetime] = {}

    async def writer() -> None:
        step = 0
        while not done.is_set():
            step += 1
            batch = [new_job(due_at=at(50_000 + step)), new_job(due_at=at(-50_000 - step))]
            out = await store.jobs_create_many(tenant.id, jobs=batch, now=T0)
            [top, below] = [run for _job, run, _ in out if run is not None]
            added_top.add(top.id)
            added_below[below.id] = below.due_at
            await asyncio.sleep(0)

    async def reader() -> list[uuid.UUID]:
        seen: list[uuid.UUID] = []
        cursor: str | None = None
        try:
            while True:
                page = await store.runs_list(tenant.id, cursor=cursor, limit=5)
                seen += [r.id for r in page.items]
                if page.next_cursor is None or len(added_below) > 200:
                    return seen
                cursor = page.next_cursor
                await asyncio.sleep(0.005)
        finally:
            done.set()

    seen, _ = await asyncio.gather(reader(), writer())
    assert added_top and added_below
    assert len(seen) == len(set(seen))
    assert not added_top & set(seen)
    assert [i for i in seen if i in set(expected)] == expected
    # Runs due below everything: read in order after the history, by the last pages.
    below = [i for i in seen if i in added_below]
    assert below == sorted(below, key=lambda i: added_below[i], reverse=True)


async def test_every_tenants_runs_for_the_admin(store: Store) -> None:
    a, b = await make_tenant(store), await make_tenant(store)
    mine = await _history(store, a.id, 30, seed=3)
    theirs = await _history(store, b.id, 30, seed=4)
    everything = await _walk(store, None, 9)
    ours = set(everything) & {r.id for r in mine + theirs}
    assert [i for i in everything if i in ours] == _order(mine + theirs)
    assert len(everything) == len(set(everything))
    # A tenant's own listing never shows another's runs, by any filter.
    assert set(await _walk(store, b.id, 50)) == {r.id for r in theirs}
    assert await _walk(store, b.id, 50, job_id=mine[0].job_id) == []
    # Across tenants, a job's runs are its tenant's.
    assert await _walk(store, None, 5, job_id=mine[0].job_id) == [mine[0].id]
    pooled = [r for r in mine + theirs if r.pool == "gpu" and r.state.value == "DISPATCHED"]
    listed = await _walk(store, None, 4, pool="gpu", states=["DISPATCHED", "SUCCESS"])
    assert [i for i in listed if i in {r.id for r in mine + theirs}] == _order(pooled)


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor",
        "",
        "aDEuMS4x",  # "h1.1.1"
        "%%%",
        "aDEuMTIzLmdnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dn",  # not hex
        "aDIuMTIzLjAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMA",  # another version
        "é",
        "a" * 101,
        "0b7c6f6e-3c4a-4f7e-9d7e-2b1f0e8a9c11",  # a run id: what the cursor was before
    ],
)
async def test_a_malformed_cursor_is_refused(store: Store, cursor: str) -> None:
    tenant = await make_tenant(store)
    with pytest.raises(ValidationError) as refused:
        await store.runs_list(tenant.id, cursor=cursor)
    assert refused.value.field == "cursor"


def test_cursors_round_trip() -> None:
    run_id = uuid.uuid4()
    for due_at in (T0, at(0.000001), datetime(1970, 1, 1, tzinfo=T0.tzinfo), at(-1e9)):
        assert history_position(history_cursor(due_at, run_id)) == (due_at, run_id)


async def _plans(store: Store, tenant_id: uuid.UUID | None, **listing: Any) -> list[str]:
    """The plans of the statements ``runs_list`` sends for ``listing``."""
    return await _plans_of(store, lambda: store.runs_list(tenant_id, **listing))


async def _plans_of(store: Store, read: Callable[[], Awaitable[Any]]) -> list[str]:
    """The plans of the statements on runs that ``read`` sends, each explained with its
    own parameters, sequential and bitmap scans off (a table this small would rather be
    read whole)."""
    caught: list[tuple[str, Any]] = []

    def catch(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM runs" in statement:
            caught.append((statement, parameters))

    engine = engine_of(store)
    event.listen(engine.sync_engine, "before_cursor_execute", catch)
    try:
        await read()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", catch)
    plans: list[str] = []
    async with engine.connect() as conn:
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_hashjoin"):
            await conn.exec_driver_sql(f"SET {setting} = off")
        for statement, parameters in caught:
            rows = await conn.exec_driver_sql(f"EXPLAIN (COSTS OFF) {statement}", parameters)
            plans.append("\n".join(r[0] for r in rows))
    assert plans
    return plans


async def _copies(store: Store, template_id: uuid.UUID, **columns: str) -> None:
    """2,000 copies of run ``template_id``, each a second earlier than the one before,
    with ``columns`` as SQL expressions (``i``: the copy's number), then ANALYZE."""
    copied = {c.name: c.name for c in runs.c} | {
        "id": "(md5(random()::text))::uuid",
        "due_at": "due_at - i * interval '1 second'",
        "fire_at": "due_at - i * interval '1 second'",
        **columns,
    }
    async with engine_of(store).begin() as conn:
        await conn.execute(
            sa.text(
                f"INSERT INTO runs ({', '.join(copied)}) SELECT {', '.join(copied.values())} "
                "FROM runs, generate_series(1, 2000) AS i WHERE runs.id = CAST(:r AS uuid)"
            ),
            {"r": str(template_id)},
        )
        await conn.execute(sa.text("ANALYZE runs"))


async def test_each_listing_is_an_index_range_walked_backwards(store: Store) -> None:
    """Each listing is a backward walk of the index its leading filters pick, the
    tenant an index condition, and no sort of what it reads (only the merge of several
    states' walks, and the incremental sort of a job's runs by id among equal due
    instants)."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's plans")
    tenant = await make_tenant(store)
    await make_tenant(store)
    made = await _history(store, tenant.id, 60, seed=5)
    # 2,000 finished runs of one more job beside them, so that a state, a job or a
    # time window picks out a few, and a tag or a pool many (the plans a tenant with a
    # long history gets; a rare tag or pool is read by the tenant's index and sorted, a
    # walk of every run of the tenant either way).
    _job, template = await create_job(store, tenant.id, due_at=at(-10_000))
    await _copies(
        store,
        template.id,
        state="'SUCCESS'",
        finished_at="due_at",
        tags="""'["red"]'::jsonb""",
        pool="CASE WHEN i % 2 = 0 THEN 'gpu' ELSE 'default' END",
    )
    first = await store.runs_list(tenant.id, limit=3)
    cases: list[tuple[RunFilter, str]] = [
        (RunFilter(), "ix_runs_tenant_due"),
        (RunFilter(since=at(0), until=at(600)), "ix_runs_tenant_due"),
        (RunFilter(since=at(-1000), until=at(-900)), "ix_runs_tenant_due"),
        (RunFilter(tags=["red"]), "ix_runs_tenant_due"),
        (RunFilter(pool="gpu"), "ix_runs_tenant_due"),
        (RunFilter(states=["DISPATCHED"]), "ix_runs_tenant_state"),
        (RunFilter(states=["DISPATCHED", "FAILED"], since=at(60)), "ix_runs_tenant_state"),
        (RunFilter(job_id=made[0].job_id), "uq_runs_tenant_id_job_id_due_at_node"),
    ]
    for tenant_id in (tenant.id, None):
        for run_filter, index in cases:
            for cursor in (None, first.next_cursor):
                for plan in await _plans(store, tenant_id, filter=run_filter, cursor=cursor):
                    where = (tenant_id, run_filter, cursor, plan)
                    assert f"Index Scan Backward using {index}" in plan, where
                    assert "Seq Scan on runs" not in plan, where
                    sorts = [line for line in plan.splitlines() if "Sort" in line]
                    assert all("Incremental Sort" in s for s in sorts) or (
                        len(run_filter.states or ()) > 1 or tenant_id is None
                    ), where
                    cond = [line for line in plan.splitlines() if "Index Cond" in line]
                    assert any("tenant_id" in line for line in cond), where
                    if cursor is not None:
                        assert any("due_at <=" in line for line in cond), where


async def test_each_jobs_last_outcome_in_one_read(store: Store) -> None:
    """A job's last outcome is its newest finished run by due instant: a run due later
    but not finished, or finished later but due earlier, is not it."""
    tenant, other = await make_tenant(store), await make_tenant(store)
    # Its first run due in an hour (unfinished), three triggered runs before that.
    job, first = await create_job(store, tenant.id, due_at=at(3600))
    triggered = [await store.jobs_trigger(tenant.id, job.id, now=at(i)) for i in (10, 20, 30)]
    # The later due one finishes first.
    await store.runs_cancel(tenant.id, triggered[1].id, now=at(40))
    await store.runs_cancel(tenant.id, triggered[0].id, now=at(45))
    idle, _ = await create_job(store, tenant.id, due_at=at(3600))
    failing, attempt = await leased_run(store, tenant.id, now=at(50))
    failed = await store.attempts_fail_many(
        items=[FailItem(attempt.attempt_id, attempt.fencing_token, error="boom", retryable=False)],
        now=at(60),
    )
    assert len(failed) == 1
    theirs, their_first = await create_job(store, other.id)
    await store.runs_cancel(other.id, their_first.id, now=at(5))

    last = await store.runs_last_finished(
        tenant.id, job_ids=[job.id, idle.id, failing.job_id, theirs.id, uuid.uuid4()]
    )
    assert set(last) == {job.id, failing.job_id}
    assert last[job.id].id == triggered[1].id and last[job.id].state.value == "CANCELLED"
    assert last[failing.job_id].id == failing.id
    assert last[failing.job_id].state.value == "FAILED"
    assert last[failing.job_id].last_error == "boom"
    assert first.id not in {r.id for r in last.values()}
    assert await store.runs_last_finished(tenant.id, job_ids=[]) == {}
    assert set(await store.runs_last_finished(other.id, job_ids=[theirs.id])) == {theirs.id}


async def test_the_last_outcomes_walk_each_jobs_key(store: Store) -> None:
    """One statement for every job: each job's key walked backwards from its newest
    run, the runs then read by their id; never a scan or a sort of the runs."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's plans")
    tenant = await make_tenant(store)
    job, template = await create_job(store, tenant.id, due_at=at(-10_000))
    await store.runs_cancel(tenant.id, template.id, now=at(0))
    await _copies(store, template.id)
    # A tenant of many jobs: the page's few are looked up by id, not filtered out.
    many = await store.jobs_create_many(
        tenant.id, jobs=[new_job(due_at=at(3600)) for _ in range(1000)], now=T0
    )
    async with engine_of(store).begin() as conn:
        await conn.execute(sa.text("ANALYZE jobs"))
    ids = [job.id, *(made.id for made, _run, _created in many[:49])]
    [plan] = await _plans_of(store, lambda: store.runs_last_finished(tenant.id, job_ids=ids))
    assert "Index Scan Backward using uq_runs_tenant_id_job_id_due_at_node" in plan, plan
    assert "Seq Scan" not in plan and "Sort" not in plan, plan
    cond = [line for line in plan.splitlines() if "Index Cond" in line]
    assert any("id = ANY" in line for line in cond), plan  # the jobs by id
    assert (await store.runs_last_finished(tenant.id, job_ids=ids))[job.id].id == template.id
