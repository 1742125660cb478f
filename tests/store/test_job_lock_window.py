"""A run made between the two locks of a change to a job, on PostgreSQL (SQLite runs one
write transaction at a time: nothing can come between).

A change to a job and its runs (a cancel, a pause, an override) locks the job's live
runs, then the job. A run committed between the two — a scheduler firing one occurrence
makes the next — was not there to be locked; whoever locks it next (to fire it, lease
it, or trigger the job) may then wait for the job while the change, holding the job,
waits for that run. PostgreSQL breaks such a deadlock by failing one of the two (a 503
at the API). The change must instead give the locks back and take them again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from cronwheel.domain.overrides import OverrideScope
from cronwheel.domain.states import RunState
from cronwheel.store import Store
from cronwheel.store.schema import jobs, runs

from .helpers import at, engine_of, make_tenant, until_lock_wait
from .test_overrides import job_runs, minutely


@pytest.fixture(autouse=True)
def _postgres_only(store: Store) -> None:
    if engine_of(store).dialect.name != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing can come between")


async def _copied(store: Store, run_id: uuid.UUID, later: timedelta) -> uuid.UUID:
    """A new run of the same job, ``later`` than ``run_id``, committed: what firing
    ``run_id`` would have made (firing itself skips a run another transaction holds)."""
    new_id = uuid.uuid4()
    by = sa.literal_column(f"interval '{int(later.total_seconds())} seconds'")
    moved: dict[str, Any] = {
        "id": sa.literal(new_id, runs.c.id.type),
        "due_at": runs.c.due_at + by,
        "fire_at": runs.c.fire_at + by,
    }
    columns = [c.name for c in runs.c]
    async with engine_of(store).begin() as conn:
        await conn.execute(
            runs.insert().from_select(
                columns,
                sa.select(*[moved.get(c, runs.c[c]) for c in columns]).where(runs.c.id == run_id),
            )
        )
    return new_id


Change = Callable[[Store, Any, Any], Awaitable[object]]

CHANGES: dict[str, Change] = {
    "cancel": lambda s, t, j: s.jobs_cancel(t.id, j.id, now=at(1)),
    "pause": lambda s, t, j: s.jobs_pause(t.id, j.id, now=at(1)),
    "override": lambda s, t, j: s.overrides_create(
        t.id, scope=OverrideScope.FUTURE, job_id=j.id, payload={"region": "us"}, now=at(1)
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_run_made_between_the_runs_and_the_job_locks_is_no_deadlock(
    store: Store, change: str
) -> None:
    tenant = await make_tenant(store)
    job, first = await minutely(store, tenant.id)
    engine = engine_of(store)
    the_job = sa.select(jobs.c.id).where(jobs.c.id == job.id)
    async with (
        engine.connect() as sharer,
        engine.connect() as firer,
        engine.connect() as watcher,
    ):
        # The job is share-locked: the change locks the first run, then waits for it.
        await sharer.begin()
        await sharer.execute(the_job.with_for_update(read=True))
        changing = asyncio.create_task(CHANGES[change](store, tenant, job))
        await until_lock_wait(watcher, changing, "the change waiting for the job")

        # Meanwhile the next occurrence is made, and locked by a transaction that then
        # wants the job, as a trigger or another override would: it queues behind the
        # change.
        second = await _copied(store, first.id, timedelta(minutes=1))
        await firer.begin()
        await firer.execute(sa.select(runs.c.id).where(runs.c.id == second).with_for_update())
        wanting = asyncio.create_task(firer.execute(the_job.with_for_update()))
        await until_lock_wait(watcher, wanting, "the other waiting for the job", waiting=2)

        # The share lock goes: the change takes the job first, finds the second run it
        # did not lock, and lets the other one go first instead of waiting for it.
        await sharer.commit()
        await asyncio.wait_for(wanting, timeout=10)
        assert not changing.done()
        await firer.commit()
        await asyncio.wait_for(changing, timeout=10)

    made = {r.id: r for r in await job_runs(store, job)}
    assert set(made) >= {first.id, second}
    if change == "cancel":
        assert {made[i].state for i in (first.id, second)} == {RunState.CANCELLED}
    elif change == "pause":
        assert all(made[i].fire_at >= at(10**6) for i in (first.id, second))
    else:
        assert all(made[i].payload["region"] == "us" for i in (first.id, second))
