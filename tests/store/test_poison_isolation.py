"""One tenant's poison row never stops a scheduler pass for everyone (both backends).

Each test writes a row no API would accept straight into the database — a retry policy
that is not one, a schedule that does not parse, a template the database refuses — as
an older version or a hand edit could have left it. Before, each of these failed every
pass before it fired anything. Now the row alone is quarantined (DEAD_LETTER, the
error kept, ``quarantined_at`` set) and, in the same pass, another tenant's run due at
that instant is dispatched on time.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.audit import Actor
from cronwheel.domain.states import TRANSITIONS, RunState
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.store.schema import jobs, runs

from .helpers import (
    NODE,
    T0,
    at,
    create_job,
    create_jobs,
    engine_of,
    events_of,
    leased_run,
    make_tenant,
    transitions_of,
)


class FakeTime:
    def __init__(self, start: datetime) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value


def _node(store: Store, time: FakeTime) -> SchedulerNode:
    settings = Settings(window_seconds=30, shard_lease_ttl=3600, dispatch_lead=0)
    return SchedulerNode(store, settings, node_id=NODE, clock=Clock(time, offset=timedelta(0)))


async def _corrupt(store: Store, table: sa.Table, row_id: uuid.UUID, **values: Any) -> None:
    async with engine_of(store).begin() as conn:
        await conn.execute(table.update().where(table.c.id == row_id).values(**values))


async def _assert_quarantined(
    store: Store, tenant_id: uuid.UUID, run_id: uuid.UUID, step: str
) -> None:
    run = await store.runs_get(tenant_id, run_id)
    assert run.state is RunState.DEAD_LETTER
    assert run.quarantined_at is not None
    assert run.finished_at is not None
    assert run.reason is not None and run.reason.startswith("quarantined: ")
    assert run.last_error and run.last_error in run.reason
    [event] = [
        e
        for e in await events_of(store, tenant_id, run_id=run_id)
        if e.to_state == RunState.DEAD_LETTER.value
    ]
    assert event.data["quarantined"] is True
    assert event.data["step"] == step
    assert event.data["error"] == run.last_error
    for source, target in await transitions_of(store, tenant_id, run_id):
        if source is not None:
            assert RunState(target) in TRANSITIONS[RunState(source)], (source, target)
    # It is an alert of its tenant, and only of its tenant.
    [listed] = await store.runs_quarantined(tenant_id)
    assert listed.run_id == run_id


async def test_a_retry_policy_that_is_not_one_quarantines_its_run_alone(store: Store) -> None:
    """The issue's first case: a lease expires and its run's retry cannot be computed."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    run, _attempt = await leased_run(store, poisoned.id, now=T0)
    await _corrupt(store, runs, run.id, retry={"initial_delay": "soon", "max_attempts": 5})
    # Another tenant's run is due the moment the lease is found expired.
    [waiting] = await create_jobs(store, other.id, 1, due_at=at(30))
    time = FakeTime(at(30))
    node = _node(store, time)

    assert await node.run_once() == 1  # the pass goes on: the other run is dispatched
    assert (await store.runs_get(other.id, waiting.id)).state is RunState.DISPATCHED
    await _assert_quarantined(store, poisoned.id, run.id, "retry")
    [attempt] = await store.attempts_list(poisoned.id, run_id=run.id)
    assert attempt.state.value == "LOST"  # the try itself ended as it was found
    assert await store.runs_count_quarantined() == 1
    time.value = at(31)
    assert await node.run_once() == 0  # and nothing is left failing


async def test_a_worker_failing_a_poisoned_run_gets_an_answer(store: Store) -> None:
    """The same run failed by its worker: an outcome, never an error for the worker."""
    from cronwheel.store import FailItem

    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, now=T0)
    _healthy, healthy_attempt = await leased_run(store, tenant.id, now=T0)
    await _corrupt(store, runs, run.id, retry="not a policy")
    outcomes = await store.attempts_fail_many(
        items=[
            FailItem(attempt.attempt_id, attempt.fencing_token, "boom"),
            FailItem(healthy_attempt.attempt_id, healthy_attempt.fencing_token, "boom"),
        ],
        now=at(1),
    )
    assert [(o.ok, o.run_state) for o in outcomes] == [
        (True, RunState.DEAD_LETTER),
        (True, RunState.SCHEDULED),  # the healthy one is retried as usual
    ]
    await _assert_quarantined(store, tenant.id, run.id, "retry")


async def test_a_schedule_that_does_not_parse_quarantines_its_run_alone(store: Store) -> None:
    poisoned, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(
        store, poisoned.id, due_at=T0, schedule={"cron": "0 * * * *"}, name="hourly"
    )
    await _corrupt(store, jobs, job.id, schedule={"cron": "61 * * * *"})
    others = await create_jobs(store, other.id, 3, due_at=T0)
    time = FakeTime(T0)
    node = _node(store, time)

    assert await node.run_once() == 3
    assert {(await store.runs_get(other.id, r.id)).state for r in others} == {RunState.DISPATCHED}
    await _assert_quarantined(store, poisoned.id, run.id, "fire")
    assert "61" in ((await store.runs_get(poisoned.id, run.id)).last_error or "")

    # Fixed by hand and redriven, the job fires again and its next occurrence follows.
    await _corrupt(store, jobs, job.id, schedule={"cron": "0 * * * *"})
    redriven = await store.runs_redrive(poisoned.id, run.id, actor=Actor("operator"), now=at(5))
    assert redriven.quarantined_at is None
    assert await store.runs_quarantined(poisoned.id) == []
    time.value = at(6)
    assert await node.run_once() == 1
    assert (await store.runs_get(poisoned.id, run.id)).state is RunState.DISPATCHED
    upcoming = await store.runs_list(poisoned.id, limit=10)
    assert any(r.due_at == T0 + timedelta(hours=1) for r in upcoming.items)


async def test_a_huge_catch_up_window_after_pause_and_resume(store: Store) -> None:
    """The issue's second case: a catch_up_window of 1e300 on a job paused and resumed
    made every pass log a traceback, and its run never fired."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(
        store, poisoned.id, due_at=T0, schedule={"cron": "0 * * * *", "catch_up": "replay"}
    )
    await store.jobs_pause(poisoned.id, job.id, actor=Actor("tester"), now=at(-10))
    await _corrupt(
        store,
        jobs,
        job.id,
        schedule={"cron": "0 * * * *", "catch_up": "replay", "catch_up_window": 1e300},
    )
    await store.jobs_resume(poisoned.id, job.id, actor=Actor("tester"), now=at(7200))
    [waiting] = await create_jobs(store, other.id, 1, due_at=at(7200))
    node = _node(store, FakeTime(at(7200)))

    assert await node.run_once() == 1
    assert (await store.runs_get(other.id, waiting.id)).state is RunState.DISPATCHED
    await _assert_quarantined(store, poisoned.id, run.id, "fire")
    assert "catch_up_window" in ((await store.runs_get(poisoned.id, run.id)).last_error or "")


async def test_a_row_the_database_refuses_is_found_and_quarantined(store: Store) -> None:
    """A failure the store cannot pin on a row (the database refuses the batch's
    statement) is split by the node until the row stands alone."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(store, poisoned.id, due_at=T0, schedule={"cron": "0 * * * *"})
    # The next occurrence would copy a priority the schema's CHECK refuses.
    template = job.template.to_json() | {"priority": 99}
    await _corrupt(store, jobs, job.id, template=template)
    others = await create_jobs(store, other.id, 7, due_at=T0)
    node = _node(store, FakeTime(T0))

    assert await node.run_once() == 7
    assert {(await store.runs_get(other.id, r.id)).state for r in others} == {RunState.DISPATCHED}
    await _assert_quarantined(store, poisoned.id, run.id, "fire")
    # Nothing of the failed attempts leaked: no next occurrence, one DEAD_LETTER event.
    assert [r.id for r in (await store.runs_list(poisoned.id, limit=10)).items] == [run.id]


async def test_an_expiry_the_database_refuses_is_found_and_quarantined(store: Store) -> None:
    poisoned, other = await make_tenant(store), await make_tenant(store)
    run, _ = await leased_run(store, poisoned.id, now=T0)
    healthy, _ = await leased_run(store, other.id, now=T0)
    # The database refuses to write this run's retry (as it would a value out of its
    # range): the sweep's one statement fails for every attempt in it.
    async with engine_of(store).begin() as conn:
        if store.dialect == "postgresql":
            await conn.execute(
                sa.text(
                    "CREATE FUNCTION cw_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN IF NEW.state = 'SCHEDULED' "
                    f"AND OLD.id = '{run.id}' THEN RAISE EXCEPTION 'refused'; END IF; "
                    "RETURN NEW; END $$"
                )
            )
            await conn.execute(
                sa.text(
                    "CREATE TRIGGER cw_refuse BEFORE UPDATE ON runs "
                    "FOR EACH ROW EXECUTE FUNCTION cw_refuse()"
                )
            )
        else:
            await conn.execute(
                sa.text(
                    "CREATE TRIGGER cw_refuse BEFORE UPDATE ON runs "
                    f"WHEN OLD.id = '{run.id.hex}' AND NEW.state = 'SCHEDULED' "
                    "BEGIN SELECT RAISE(ABORT, 'refused'); END"
                )
            )
    node = _node(store, FakeTime(at(30)))
    await node.run_once()
    await _assert_quarantined(store, poisoned.id, run.id, "expire")
    # The other tenant's expired attempt was ended and its run retried as usual.
    assert (await store.runs_get(other.id, healthy.id)).state is RunState.SCHEDULED


async def test_requirements_that_are_no_list_quarantine_their_run_alone(store: Store) -> None:
    """The routing check reads runs by group; one run's unreadable requirements no
    longer fail it for every tenant (nor leave the run in the queue for ever)."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    [bad] = await create_jobs(store, poisoned.id, 1, due_at=T0)
    [waiting] = await create_jobs(store, other.id, 1, due_at=T0, requires=["cuda"])
    time = FakeTime(T0)
    node = _node(store, time)
    assert await node.run_once() == 2
    await _corrupt(store, runs, bad.id, requires={"cuda": True})
    time.value = at(10)  # both have waited past the routing check's minimum
    await node.run_once()
    await _assert_quarantined(store, poisoned.id, bad.id, "route")
    # The other tenant's run is told why it waits, as before.
    run = await store.runs_get(other.id, waiting.id)
    assert run.state is RunState.DISPATCHED
    assert run.wait_reason == "no live worker in pool 'default' has capabilities ['cuda']"


async def test_an_overlap_policy_that_is_not_one_quarantines_its_run_alone(store: Store) -> None:
    """The overlap step reads the policy of every guarded job in the batch; one job's
    unreadable policy is its own run's fault, not the batch's."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(
        store, poisoned.id, due_at=T0, schedule={"cron": "0 * * * *", "overlap": "queue_one"}
    )
    await _corrupt(store, jobs, job.id, schedule={"cron": "0 * * * *", "overlap": ["skip"]})
    guarded, _ = await create_job(
        store, other.id, due_at=T0, schedule={"cron": "0 * * * *", "overlap": "skip"}
    )
    [waiting] = await create_jobs(store, other.id, 1, due_at=T0)
    node = _node(store, FakeTime(T0))

    assert await node.run_once() == 2
    assert (await store.runs_get(other.id, waiting.id)).state is RunState.DISPATCHED
    [fired] = [
        r
        for r in (await store.runs_list(other.id, limit=10)).items
        if r.job_id == guarded.id and r.due_at == T0
    ]
    assert fired.state is RunState.DISPATCHED
    await _assert_quarantined(store, poisoned.id, run.id, "fire")


async def test_a_schedule_that_is_no_object_is_found_and_quarantined(store: Store) -> None:
    """A schedule stored as text fails the batch before any row's own plan is computed:
    the node splits the batch until the row stands alone."""
    poisoned, other = await make_tenant(store), await make_tenant(store)
    job, run = await create_job(store, poisoned.id, due_at=T0, schedule={"cron": "0 * * * *"})
    await _corrupt(store, jobs, job.id, schedule="hourly")
    others = await create_jobs(store, other.id, 5, due_at=T0)
    node = _node(store, FakeTime(T0))

    assert await node.run_once() == 5
    assert {(await store.runs_get(other.id, r.id)).state for r in others} == {RunState.DISPATCHED}
    await _assert_quarantined(store, poisoned.id, run.id, "fire")
