"""Dead letters sent back in bulk: chosen by ids, by job or all of a tenant's, limited,
recorded, and a new series of attempts whose numbers go on."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import IllegalTransitionError, NotFoundError, ValidationError
from cronwheel.domain.model import Run
from cronwheel.domain.states import REDRIVE, RETRY, JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store import FailItem, Store
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.store.values import REDRIVE_BATCH_MAX

from .helpers import (
    ALL_SHARDS,
    T0,
    at,
    create_job,
    create_jobs,
    events_of,
    fire,
    make_tenant,
    register_worker,
    transitions_of,
)

ONE_TRY = {"max_attempts": 1, "initial_delay": 1.0}


async def dead_letters(store: Store, tenant_id: uuid.UUID, runs: list[Run]) -> list[Run]:
    """Fire, lease and fail ``runs`` (each allowed one try, due by ``at(1)``):
    DEAD_LETTER at ``at(2)``."""
    await fire(store, runs, now=at(1))
    worker = await register_worker(store, tenant_id)
    leased = await store.attempts_lease(worker=worker, max=len(runs), now=at(1))
    assert {a.run_id for a in leased} == {r.id for r in runs}
    outcomes = await store.attempts_fail_many(
        items=[FailItem(a.attempt_id, a.fencing_token, "boom") for a in leased], now=at(2)
    )
    assert all(o.ok for o in outcomes)
    out = [await store.runs_get(tenant_id, r.id) for r in runs]
    assert {r.state for r in out} == {RunState.DEAD_LETTER}
    return sorted(out, key=lambda r: r.id)


async def new_dead_letters(store: Store, tenant_id: uuid.UUID, count: int) -> list[Run]:
    """``count`` one-off jobs whose runs are dead letters, in id order."""
    return await dead_letters(
        store, tenant_id, await create_jobs(store, tenant_id, count, retry=ONE_TRY)
    )


async def states(store: Store, tenant_id: uuid.UUID, runs: list[Run]) -> list[RunState]:
    return [(await store.runs_get(tenant_id, r.id)).state for r in runs]


async def test_by_ids_sends_back_only_dead_letters(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    dead = await new_dead_letters(store, tenant.id, 2)
    [foreign] = await new_dead_letters(store, other.id, 1)
    _job, pending = await create_job(store, tenant.id, due_at=at(3600))
    unknown = new_id()
    before = await store.runs_get(tenant.id, pending.id)

    batch = await store.runs_redrive_many(
        tenant.id,
        run_ids=[pending.id, dead[1].id, unknown, foreign.id, dead[0].id, dead[1].id],
        actor=Actor("ops@example"),
        reason="disk replaced",
        now=at(10),
    )

    assert [r.id for r in batch.runs] == [dead[0].id, dead[1].id]  # id order, once each
    for run in batch.runs:
        assert run.state is RunState.SCHEDULED
        assert (run.fire_at, run.finished_at, run.reason) == (at(10), None, "disk replaced")
        assert (run.attempt, run.max_attempts) == (1, 2)
        assert run == await store.runs_get(tenant.id, run.id)
    # Every other id is reported, in the order given, with what was found.
    assert batch.skipped == {
        pending.id: "not a dead letter: SCHEDULED",
        unknown: "not found",
        foreign.id: "not found",
    }
    assert batch.more is False
    assert await store.runs_get(tenant.id, pending.id) == before
    assert (await store.runs_get(other.id, foreign.id)).state is RunState.DEAD_LETTER
    # Due at once: the scheduler's scan finds them.
    due = await store.runs_due_scan(
        shards=sorted({r.shard for r in dead}), until=at(10) + timedelta(seconds=1)
    )
    assert {r.id for r in dead} <= {d.id for d in due}
    # The finished one-off jobs run again.
    for run in dead:
        assert (await store.jobs_get(tenant.id, run.job_id)).state is JobState.ACTIVE

    for run in dead:
        [*_, last] = await events_of(store, tenant.id, run_id=run.id)
        assert (last.kind, last.from_state, last.to_state) == (
            "run.transition",
            "DEAD_LETTER",
            "SCHEDULED",
        )
        assert (last.at, last.actor, last.reason) == (at(10), "ops@example", "disk replaced")
    assert (await transitions_of(store, other.id, foreign.id))[-1] == ("RUNNING", "DEAD_LETTER")


async def test_by_job_and_all_of_a_tenant(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    job, first = await create_job(store, tenant.id, retry=ONE_TRY)
    triggered = [await store.jobs_trigger(tenant.id, job.id, now=T0) for _ in range(2)]
    of_job = await dead_letters(store, tenant.id, [first, *triggered])
    elsewhere = await new_dead_letters(store, tenant.id, 1)
    foreign = await new_dead_letters(store, other.id, 1)

    batch = await store.runs_redrive_many(tenant.id, job_id=job.id, now=at(10))
    assert [r.id for r in batch.runs] == [r.id for r in of_job]
    assert (batch.skipped, batch.more) == ({}, False)
    assert await states(store, tenant.id, elsewhere) == [RunState.DEAD_LETTER]
    # Nothing left of the job: an empty batch, not an error.
    again = await store.runs_redrive_many(tenant.id, job_id=job.id, now=at(11))
    assert (again.runs, again.skipped, again.more) == ([], {}, False)

    # No selector: every dead letter of the tenant, and only of the tenant.
    batch = await store.runs_redrive_many(tenant.id, now=at(12))
    assert [r.id for r in batch.runs] == [r.id for r in elsewhere]
    assert await states(store, other.id, foreign) == [RunState.DEAD_LETTER]

    # Ids and job together: runs meeting both.
    dead = await new_dead_letters(store, tenant.id, 2)
    batch = await store.runs_redrive_many(
        tenant.id, run_ids=[r.id for r in dead], job_id=dead[0].job_id, now=at(13)
    )
    assert [r.id for r in batch.runs] == [dead[0].id]
    assert batch.skipped == {dead[1].id: "over the limit"}


async def test_an_unknown_or_foreign_job_is_not_found(store: Store) -> None:
    tenant = await make_tenant(store)
    other = await make_tenant(store)
    [foreign] = await new_dead_letters(store, other.id, 1)
    [mine] = await new_dead_letters(store, tenant.id, 1)
    for job_id in (new_id(), foreign.job_id):
        with pytest.raises(NotFoundError, match="job"):
            await store.runs_redrive_many(tenant.id, job_id=job_id, now=at(10))
    assert await states(store, other.id, [foreign]) == [RunState.DEAD_LETTER]
    assert await states(store, tenant.id, [mine]) == [RunState.DEAD_LETTER]


async def test_limit_takes_the_oldest_and_says_more_remain(store: Store) -> None:
    tenant = await make_tenant(store)
    dead = await new_dead_letters(store, tenant.id, 5)

    first = await store.runs_redrive_many(tenant.id, limit=2, now=at(10))
    assert ([r.id for r in first.runs], first.more) == ([r.id for r in dead[:2]], True)
    # Exactly the rest: the limit is reached but nothing matches any more.
    rest = await store.runs_redrive_many(tenant.id, limit=3, now=at(11))
    assert ([r.id for r in rest.runs], rest.more) == ([r.id for r in dead[2:]], False)

    dead = await new_dead_letters(store, tenant.id, 3)
    cut = await store.runs_redrive_many(
        tenant.id, run_ids=[r.id for r in reversed(dead)], limit=1, now=at(12)
    )
    assert [r.id for r in cut.runs] == [dead[0].id]
    assert cut.skipped == {dead[2].id: "over the limit", dead[1].id: "over the limit"}
    assert cut.more is True
    assert await states(store, tenant.id, dead) == [
        RunState.SCHEDULED,
        RunState.DEAD_LETTER,
        RunState.DEAD_LETTER,
    ]


async def test_attempt_numbers_go_on_across_series(store: Store) -> None:
    tenant = await make_tenant(store)
    [run] = await new_dead_letters(store, tenant.id, 1)
    worker = await register_worker(store, tenant.id)
    for series in (2, 3):
        now = at(10 * series)
        [sent] = (await store.runs_redrive_many(tenant.id, run_ids=[run.id], now=now)).runs
        assert (sent.attempt, sent.max_attempts) == (series - 1, series)
        await fire(store, [sent], now=now)
        [attempt] = await store.attempts_lease(worker=worker, max=1, now=now)
        assert attempt.run_id == run.id and attempt.number == series
        await store.attempts_fail_many(
            items=[FailItem(attempt.attempt_id, attempt.fencing_token, "again")], now=now
        )
        after = await store.runs_get(tenant.id, run.id)
        assert (after.state, after.attempt) == (RunState.DEAD_LETTER, series)
    numbers = [a.number for a in await store.attempts_list(tenant.id, run_id=run.id)]
    assert numbers == [1, 2, 3]


async def test_two_batches_racing_send_each_run_back_once(store: Store) -> None:
    tenant = await make_tenant(store)
    dead = await new_dead_letters(store, tenant.id, 20)
    every, named = await asyncio.gather(
        store.runs_redrive_many(tenant.id, now=at(10)),
        store.runs_redrive_many(tenant.id, run_ids=[r.id for r in reversed(dead)], now=at(10)),
    )
    by_all, by_ids = {r.id for r in every.runs}, {r.id for r in named.runs}
    assert by_all.isdisjoint(by_ids) and by_all | by_ids == {r.id for r in dead}
    assert set(named.skipped) == by_all
    for run in dead:
        assert (await transitions_of(store, tenant.id, run.id)).count(
            ("DEAD_LETTER", "SCHEDULED")
        ) == 1
        assert (await store.runs_get(tenant.id, run.id)).max_attempts == 2


async def test_bad_arguments_change_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    dead = await new_dead_letters(store, tenant.id, 1)
    too_many = [new_id() for _ in range(REDRIVE_BATCH_MAX + 1)]
    for kwargs, field in (
        ({"limit": 0}, "limit"),
        ({"limit": REDRIVE_BATCH_MAX + 1}, "limit"),
        ({"run_ids": too_many}, "run_ids"),
    ):
        with pytest.raises(ValidationError) as caught:
            await store.runs_redrive_many(tenant.id, now=at(10), **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field
    assert await states(store, tenant.id, dead) == [RunState.DEAD_LETTER]
    # No ids at all: nothing to do.
    empty = await store.runs_redrive_many(tenant.id, run_ids=[], now=at(10))
    assert (empty.runs, empty.skipped, empty.more) == ([], {}, False)
    assert await states(store, tenant.id, dead) == [RunState.DEAD_LETTER]


async def test_single_redrive_shares_the_write(store: Store) -> None:
    tenant = await make_tenant(store)
    [run] = await new_dead_letters(store, tenant.id, 1)
    sent = await store.runs_redrive(tenant.id, run.id, actor=Actor("a"), reason="r", now=at(10))
    [batch_twin] = await new_dead_letters(store, tenant.id, 1)
    [twin] = (
        await store.runs_redrive_many(
            tenant.id, run_ids=[batch_twin.id], actor=Actor("a"), reason="r", now=at(10)
        )
    ).runs
    same = ("state", "fire_at", "finished_at", "reason", "attempt", "max_attempts")
    assert [getattr(sent, f) for f in same] == [getattr(twin, f) for f in same]
    one = (await events_of(store, tenant.id, run_id=run.id))[-1]
    many = (await events_of(store, tenant.id, run_id=twin.id))[-1]
    assert (one.kind, one.from_state, one.to_state, one.actor, one.reason) == (
        many.kind,
        many.from_state,
        many.to_state,
        many.actor,
        many.reason,
    )


# -- the run's job decides: cancelled runs nothing more, paused holds -----------------


async def recurring_dead_letters(store: Store, tenant_id: uuid.UUID, count: int) -> list[Run]:
    """Dead letters of recurring jobs (each job is still active: its next occurrence
    was made when the first fired), in id order."""
    runs = await create_jobs(
        store,
        tenant_id,
        count,
        retry=ONE_TRY,
        schedule={"interval": 600, "start": T0.isoformat()},
    )
    return await dead_letters(store, tenant_id, runs)


async def test_a_cancelled_jobs_dead_letter_is_not_sent_back(store: Store) -> None:
    tenant = await make_tenant(store)
    run, other = await recurring_dead_letters(store, tenant.id, 2)
    await store.jobs_cancel(tenant.id, run.job_id, now=at(3))
    for move in (REDRIVE, RETRY):
        with pytest.raises(IllegalTransitionError, match="its job is cancelled"):
            await store.runs_redrive(tenant.id, run.id, move=move, now=at(4))
    batch = await store.runs_redrive_many(tenant.id, run_ids=[run.id, other.id], now=at(4))
    assert [r.id for r in batch.runs] == [other.id]
    assert batch.skipped == {run.id: "its job is cancelled"}
    # Nor left over for "all": a client redriving until nothing is left stops.
    everything = await store.runs_redrive_many(tenant.id, now=at(5))
    assert (everything.runs, everything.more) == ([], False)
    assert await states(store, tenant.id, [run]) == [RunState.DEAD_LETTER]


async def test_a_paused_jobs_dead_letter_goes_back_held_until_resume(store: Store) -> None:
    tenant = await make_tenant(store)
    one, two = await recurring_dead_letters(store, tenant.id, 2)
    for run in (one, two):
        await store.jobs_pause(tenant.id, run.job_id, now=at(3))
    sent = await store.runs_redrive(tenant.id, one.id, now=at(4))
    [also] = (await store.runs_redrive_many(tenant.id, run_ids=[two.id], now=at(4))).runs
    for held in (sent, also):
        assert held.state is RunState.SCHEDULED
        assert (held.fire_at, held.reason) == (PARKED_FIRE_AT, "job paused")
    # Not due while the job is paused ...
    due = await store.runs_due_scan(shards=ALL_SHARDS, until=at(10**6))
    assert {d.id for d in due} & {one.id, two.id} == set()
    assert "run.parked" in [e.kind for e in await events_of(store, tenant.id, run_id=one.id)]
    # ... due at its own instant (past: at once) when it resumes.
    await store.jobs_resume(tenant.id, one.job_id, now=at(5))
    due = await store.runs_due_scan(shards=ALL_SHARDS, until=at(6))
    assert one.id in {d.id for d in due} and two.id not in {d.id for d in due}
