"""Runs: listing, cancelling, and the state invariants the database itself enforces."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import CompleteItem, FailItem, HeartbeatItem, RunFilter, Store
from cronwheel.store.schema import runs

from .helpers import (
    T0,
    at,
    create_job,
    create_jobs,
    engine_of,
    events_of,
    fire,
    leased_run,
    make_tenant,
    transitions_of,
)


async def _listed(store: Store, tenant_id: uuid.UUID, **filters: Any) -> list[uuid.UUID]:
    page = await store.runs_list(tenant_id, filter=RunFilter(**filters), limit=1000)
    assert page.next_cursor is None
    return [r.id for r in page.items]


async def test_runs_list_filters(store: Store) -> None:
    tenant = await make_tenant(store)
    job_a, a = await create_job(store, tenant.id, due_at=at(0), tags=["red"], now=at(0))
    job_b, b = await create_job(store, tenant.id, due_at=at(100), tags=["blue"], now=at(1))
    _job_c, c = await create_job(store, tenant.id, due_at=at(200), tags=["red", "blue"], now=at(2))
    await fire(store, [a], now=at(0))

    assert await _listed(store, tenant.id) == [c.id, b.id, a.id]
    assert await _listed(store, tenant.id, job_id=job_b.id) == [b.id]
    assert await _listed(store, tenant.id, job_id=uuid.uuid4()) == []
    assert await _listed(store, tenant.id, states=["DISPATCHED"]) == [a.id]
    assert await _listed(store, tenant.id, states=["SCHEDULED", "DISPATCHED"]) == [c.id, b.id, a.id]
    assert await _listed(store, tenant.id, states=["SUCCESS"]) == []
    # since is inclusive, until exclusive, both on due_at.
    assert await _listed(store, tenant.id, since=at(100)) == [c.id, b.id]
    assert await _listed(store, tenant.id, until=at(100)) == [a.id]
    assert await _listed(store, tenant.id, since=at(100), until=at(200)) == [b.id]
    assert await _listed(store, tenant.id, tags=["red"]) == [c.id, a.id]
    assert await _listed(store, tenant.id, tags=["re"]) == []
    assert await _listed(store, tenant.id, tags=["blue"], states=["SCHEDULED"]) == [c.id, b.id]
    assert await _listed(store, tenant.id, job_id=job_a.id, states=["SCHEDULED"]) == []

    counts = await store.runs_count_by_state()
    assert set(counts) == {s.value for s in RunState}
    assert {s: n for s, n in counts.items() if n} == {"SCHEDULED": 2, "DISPATCHED": 1}


async def test_runs_list_pages_without_gaps_or_duplicates(store: Store) -> None:
    tenant = await make_tenant(store)
    first = await create_jobs(store, tenant.id, 25)  # one batch: one creation instant
    later = [(await create_job(store, tenant.id, now=at(i + 1)))[1] for i in range(5)]
    expected = {r.id for r in first + later}

    seen: list[uuid.UUID] = []
    created: list[Any] = []
    cursor: str | None = None
    while True:
        page = await store.runs_list(tenant.id, cursor=cursor, limit=7)
        assert len(page.items) <= 7
        seen += [r.id for r in page.items]
        created += [r.created_at for r in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 30
    assert set(seen) == expected
    assert seen[:5] == [r.id for r in reversed(later)]  # newest first
    assert created == sorted(created, reverse=True)
    with pytest.raises(ValidationError):
        await store.runs_list(tenant.id, cursor="not a cursor")


async def test_runs_cancel_scheduled_run(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(60))
    cancelled = await store.runs_cancel(
        tenant.id, run.id, actor=Actor("carol"), reason="duplicate", now=at(5)
    )
    assert cancelled.state is RunState.CANCELLED
    assert cancelled.finished_at == at(5)
    assert await store.runs_get(tenant.id, run.id) == cancelled
    [*_, last] = await events_of(store, tenant.id, run_id=run.id)
    assert (last.from_state, last.to_state, last.actor, last.reason) == (
        "SCHEDULED",
        "CANCELLED",
        "carol",
        "duplicate",
    )
    # Terminal: cancelling again is refused and writes nothing.
    with pytest.raises(IllegalTransitionError):
        await store.runs_cancel(tenant.id, run.id, now=at(6))
    assert await store.runs_get(tenant.id, run.id) == cancelled
    assert len(await events_of(store, tenant.id, run_id=run.id)) == 2
    # And it is never fired.
    assert await fire(store, [run], now=at(60)) == []
    assert await store.runs_due_scan(shards=[run.shard], until=at(3600)) == []


async def test_runs_cancel_running_run_is_cooperative(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)
    asked = await store.runs_cancel(tenant.id, run.id, actor=Actor("carol"), now=at(1))
    assert asked.state is RunState.RUNNING
    assert asked.finished_at is None

    item = HeartbeatItem(attempt.attempt_id, attempt.fencing_token)
    [beat] = await store.attempts_heartbeat_many(items=[item], now=at(2))
    assert beat.ok
    assert beat.cancel_requested

    # The handler stops and reports success: the run ends CANCELLED, not SUCCESS.
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)], now=at(3)
    )
    assert done.ok
    after = await store.runs_get(tenant.id, run.id)
    assert after.state is RunState.CANCELLED
    assert after.finished_at == at(3)
    assert (await transitions_of(store, tenant.id, run.id))[-1] == ("RUNNING", "CANCELLED")
    with pytest.raises(IllegalTransitionError):
        await store.runs_cancel(tenant.id, run.id, now=at(4))

    # The handler fails instead: attempts are left, but a cancelled run is not retried.
    failing, failing_attempt = await leased_run(store, tenant.id, retry={"max_attempts": 5})
    await store.runs_cancel(tenant.id, failing.id, now=at(1))
    [failed] = await store.attempts_fail_many(
        items=[FailItem(failing_attempt.attempt_id, failing_attempt.fencing_token, "stopped")],
        now=at(2),
    )
    assert failed.ok
    after = await store.runs_get(tenant.id, failing.id)
    assert (after.state, after.finished_at) == (RunState.CANCELLED, at(2))
    [tried] = await store.attempts_list(tenant.id, run_id=failing.id)
    assert tried.state is AttemptState.FAILED


async def test_finished_at_is_set_exactly_in_terminal_states(store: Store) -> None:
    """The CHECK constraint holds the database to the state machine on its own."""
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id)
    engine = engine_of(store)

    async def update(**values: Any) -> None:
        async with engine.begin() as conn:
            await conn.execute(runs.update().where(runs.c.id == run.id).values(**values))

    with pytest.raises(IntegrityError):
        await update(state=RunState.SUCCESS.value)  # terminal without finished_at
    with pytest.raises(IntegrityError):
        await update(finished_at=T0)  # SCHEDULED with finished_at
    with pytest.raises(IntegrityError):
        await update(state="FINISHED", finished_at=T0)  # not a run state
    with pytest.raises(IntegrityError):
        await update(shard=256)
    assert await store.runs_get(tenant.id, run.id) == run

    # The legal combination goes through: the constraint is not simply rejecting updates.
    await update(state=RunState.SUCCESS.value, finished_at=at(1))
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SUCCESS
    with pytest.raises(IntegrityError):
        await update(finished_at=None)
