"""Bulk operations in the store: accepted (or refused, storing nothing), claimed under a
lease, and carried out in steps, soonest-due first, on both backends."""

from __future__ import annotations

import uuid

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import LeaseLostError, Operation, OperationState, Selector
from cronwheel.domain.errors import TenantLimitError, ValidationError
from cronwheel.domain.states import JobState, RunState
from cronwheel.store import FailItem, Store
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.store.sql import bulk

from .helpers import (
    ALL_SHARDS,
    NODE,
    T0,
    at,
    create_job,
    fire,
    hold_all_shards,
    make_tenant,
    register_worker,
)
from .test_redrive import recurring_dead_letters
from .test_reservations import _ahead_run

OPS = Actor("k-ops", role="operator", request_id="bulk-1")


async def run_to_end(store: Store, op: Operation, *, now_s: float = 10) -> Operation:
    """Claim ``op`` and take its steps until it is done."""
    claimed = await store.operations_claim(owner="api-1", ttl=30, now=at(now_s))
    assert claimed is not None and claimed.id == op.id
    for _ in range(1000):
        done = await store.operations_step(op.id, owner="api-1", ttl=30, now=at(now_s))
        if done.state is OperationState.DONE:
            return done
    raise AssertionError("the operation never ended")


@pytest.mark.parametrize(
    ("action", "selector", "field"),
    [
        ("cancel", Selector(), "selector"),
        ("cancel", Selector(all=True, pool="p"), "selector.all"),
        ("pause", Selector(run_ids=(uuid.uuid4(),)), "selector.run_ids"),
        ("pause", Selector(states=("SCHEDULED",)), "selector.states"),
        ("cancel", Selector(states=("SUCCESS",)), "selector.states"),
        ("redrive", Selector(states=("FAILED",)), "selector.states"),
        ("explode", Selector(pool="p"), "action"),
        ("cancel", Selector(due_after=at(5), due_before=at(5)), "selector.due_before"),
    ],
)
async def test_a_bad_request_stores_nothing(
    store: Store, action: str, selector: Selector, field: str
) -> None:
    tenant = await make_tenant(store)
    with pytest.raises(ValidationError) as caught:
        await store.operations_create(tenant.id, action=action, selector=selector, actor=OPS)
    assert caught.value.field == field
    assert (await store.operations_list(tenant.id)).items == []


async def test_cancel_by_tag_soonest_due_first(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "STEP", 2)
    tenant = await make_tenant(store)
    tagged = [
        (await create_job(store, tenant.id, due_at=at(100 - i), tags=["billing"]))[1]
        for i in range(5)
    ]
    _other_job, untouched = await create_job(store, tenant.id, due_at=at(50), tags=["ops"])
    op = await store.operations_create(
        tenant.id,
        action="cancel",
        selector=Selector(tags_all=("billing",)),
        actor=OPS,
        reason="bad deploy",
        now=at(1),
    )
    assert op.state is OperationState.PENDING
    await store.operations_claim(owner="api-1", ttl=30, now=at(2))
    first = await store.operations_step(op.id, owner="api-1", ttl=30, now=at(2))
    # The two due soonest went first.
    soonest = sorted(tagged, key=lambda r: r.fire_at)[:2]
    states = {r.id: (await store.runs_get(tenant.id, r.id)).state for r in tagged}
    assert {i for i, s in states.items() if s is RunState.CANCELLED} == {r.id for r in soonest}
    assert (first.state, first.matched, first.changed) == (OperationState.RUNNING, 2, 2)
    done = await run_to_end_claimed(store, op)
    assert (done.matched, done.changed, done.skipped) == (5, 5, {})
    for r in tagged:
        run = await store.runs_get(tenant.id, r.id)
        assert (run.state, run.reason) == (RunState.CANCELLED, "bad deploy")
    assert (await store.runs_get(tenant.id, untouched.id)).state is RunState.SCHEDULED
    [record] = (await store.audit_list(tenant.id, action="bulk.cancel")).items
    assert (record.target_id, record.request_id) == (str(op.id), "bulk-1")
    assert record.after == {"selector": {"tags_all": ["billing"]}}


async def run_to_end_claimed(store: Store, op: Operation) -> Operation:
    for _ in range(1000):
        step = await store.operations_step(op.id, owner="api-1", ttl=30, now=at(3))
        if step.state is OperationState.DONE:
            return step
    raise AssertionError("the operation never ended")


async def test_named_ids_of_another_tenant_are_not_found_and_untouched(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    _job, mine = await create_job(store, tenant.id, due_at=at(60))
    _theirs_job, theirs = await create_job(store, other.id, due_at=at(60))
    _done_job, finished = await create_job(store, tenant.id, due_at=at(60))
    await store.runs_cancel(tenant.id, finished.id, now=at(0))
    op = await store.operations_create(
        tenant.id,
        action="cancel",
        selector=Selector(run_ids=(mine.id, theirs.id, finished.id)),
        actor=OPS,
        now=at(1),
    )
    done = await run_to_end(store, op)
    assert (done.matched, done.changed) == (3, 1)
    assert done.skipped == {"not found": 1, "cancelled": 1}
    assert (await store.runs_get(other.id, theirs.id)).state is RunState.SCHEDULED


async def test_pause_and_resume_by_name_prefix(store: Store) -> None:
    tenant = await make_tenant(store)
    nightly = [
        await create_job(store, tenant.id, due_at=at(60), name=f"nightly-{i}") for i in range(3)
    ]
    _hourly, kept = await create_job(store, tenant.id, due_at=at(60), name="hourly")
    pause = await store.operations_create(
        tenant.id, action="pause", selector=Selector(name_prefix="nightly-"), actor=OPS, now=at(1)
    )
    done = await run_to_end(store, pause)
    assert (done.matched, done.changed) == (3, 3)
    for job, run in nightly:
        assert (await store.jobs_get(tenant.id, job.id)).state is JobState.PAUSED
        assert (await store.runs_get(tenant.id, run.id)).fire_at == PARKED_FIRE_AT
    assert (await store.runs_get(tenant.id, kept.id)).fire_at == at(60)
    resume = await store.operations_create(
        tenant.id, action="resume", selector=Selector(name_prefix="nightly-"), actor=OPS, now=at(11)
    )
    done = await run_to_end(store, resume, now_s=12)
    assert (done.matched, done.changed) == (3, 3)
    for job, run in nightly:
        assert (await store.jobs_get(tenant.id, job.id)).state is JobState.ACTIVE
        assert (await store.runs_get(tenant.id, run.id)).fire_at == at(60)


async def test_an_empty_list_of_ids_selects_nothing(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(60))
    op = await store.operations_create(
        tenant.id, action="cancel", selector=Selector(run_ids=()), actor=OPS, now=at(1)
    )
    done = await run_to_end(store, op)
    assert (done.matched, done.changed) == (0, 0)
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED


async def test_the_selection_is_what_matched_when_accepted(store: Store) -> None:
    tenant = await make_tenant(store)
    before, _run = await create_job(store, tenant.id, due_at=at(600), now=T0, tags=["t"])
    op = await store.operations_create(
        tenant.id, action="pause", selector=Selector(tags_any=("t", "u")), actor=OPS, now=at(1)
    )
    later, _run = await create_job(store, tenant.id, due_at=at(600), now=at(2), tags=["t"])
    await run_to_end(store, op)
    assert (await store.jobs_get(tenant.id, before.id)).state is JobState.PAUSED
    assert (await store.jobs_get(tenant.id, later.id)).state is JobState.ACTIVE


async def test_redrive_and_trigger(store: Store) -> None:
    tenant = await make_tenant(store)
    dead = await recurring_dead_letters(store, tenant.id, 3)
    await store.jobs_cancel(tenant.id, dead[0].job_id, now=at(3))
    redrive = await store.operations_create(
        tenant.id,
        action="redrive",
        selector=Selector(run_ids=tuple(r.id for r in dead)),
        actor=OPS,
        now=at(4),
    )
    done = await run_to_end(store, redrive)
    assert (done.matched, done.changed, done.skipped) == (3, 2, {"job cancelled": 1})
    states = [(await store.runs_get(tenant.id, r.id)).state for r in dead]
    assert states == [RunState.DEAD_LETTER, RunState.SCHEDULED, RunState.SCHEDULED]

    trigger = await store.operations_create(
        tenant.id,
        action="trigger",
        selector=Selector(job_ids=tuple(r.job_id for r in dead)),
        actor=OPS,
        now=at(20),
    )
    done = await run_to_end(store, trigger, now_s=21)
    # The cancelled job is not triggered.
    assert (done.matched, done.changed, done.skipped) == (3, 2, {"cancelled": 1})
    page = await store.runs_list(tenant.id, limit=100)
    triggered = [r for r in page.items if r.origin == "trigger"]
    assert sorted(r.job_id for r in triggered) == sorted(r.job_id for r in dead[1:])


async def test_only_the_holder_steps_and_a_lapsed_lease_is_taken_over(store: Store) -> None:
    tenant = await make_tenant(store)
    await create_job(store, tenant.id, due_at=at(60), tags=["x"])
    op = await store.operations_create(
        tenant.id, action="cancel", selector=Selector(tags_all=("x",)), actor=OPS, now=at(1)
    )
    assert (await store.operations_claim(owner="api-1", ttl=5, now=at(2))) is not None
    assert await store.operations_claim(owner="api-2", ttl=5, now=at(3)) is None
    with pytest.raises(LeaseLostError):
        await store.operations_step(op.id, owner="api-2", ttl=5, now=at(3))
    # api-1 went silent: after its lease, api-2 takes the operation over and ends it.
    taken = await store.operations_claim(owner="api-2", ttl=5, now=at(8))
    assert taken is not None and taken.id == op.id
    with pytest.raises(LeaseLostError):
        await store.operations_step(op.id, owner="api-1", ttl=5, now=at(8))
    last = await store.operations_step(op.id, owner="api-2", ttl=5, now=at(9))
    while last.state is not OperationState.DONE:
        last = await store.operations_step(op.id, owner="api-2", ttl=5, now=at(9))
    assert last.changed == 1
    assert await store.operations_claim(owner="api-3", ttl=5, now=at(20)) is None


# -- what a node or a worker already holds ----------------------------------------------


async def test_a_bulk_cancel_or_pause_wins_over_a_reservation(store: Store) -> None:
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    cancelled = await _ahead_run(store, tenant.id, tags=["c"])
    [first] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(1))
    paused = await _ahead_run(store, tenant.id, tags=["p"])
    [second] = await store.attempts_lease(worker=worker, max=10, ahead=5, now=at(1))
    for action, tag in (("cancel", "c"), ("pause", "p")):
        op = await store.operations_create(
            tenant.id, action=action, selector=Selector(tags_all=(tag,)), actor=OPS, now=at(2)
        )
        await run_to_end(store, op, now_s=2)
    started = await store.attempts_start_many(
        worker_id=worker.id, tokens=[first.fencing_token, second.fencing_token], now=at(3)
    )
    assert sorted(started.refused) == sorted([first.fencing_token, second.fencing_token])
    assert (await store.runs_get(tenant.id, cancelled.id)).state is RunState.CANCELLED
    held = await store.runs_get(tenant.id, paused.id)
    assert (held.state, held.fire_at) == (RunState.SCHEDULED, PARKED_FIRE_AT)


async def test_a_run_in_a_nodes_window_does_not_fire_once_cancelled(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(5), tags=["w"])
    # A node read it into its window (it holds the id and the instant) ...
    await hold_all_shards(store, now=at(0))
    [due] = [
        d for d in await store.runs_due_scan(shards=ALL_SHARDS, until=at(30)) if d.id == run.id
    ]
    op = await store.operations_create(
        tenant.id, action="cancel", selector=Selector(tags_all=("w",)), actor=OPS, now=at(1)
    )
    await run_to_end(store, op, now_s=1)
    # ... and fires it at its instant: nothing goes.
    assert await store.runs_fire(run_ids=[due.id], node_id=NODE, now=at(5), lead=0) == []


async def test_a_run_redriven_that_dies_again_is_not_taken_twice(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "STEP", 1)
    tenant = await make_tenant(store)
    first, second = await recurring_dead_letters(store, tenant.id, 2)
    op = await store.operations_create(
        tenant.id,
        action="redrive",
        selector=Selector(run_ids=(first.id, second.id)),
        actor=OPS,
        now=at(4),
    )
    await store.operations_claim(owner="api-1", ttl=30, now=at(10))
    await store.operations_step(op.id, owner="api-1", ttl=30, now=at(10))
    # The first one sent back dies again before the next step.
    again = await store.runs_get(tenant.id, first.id)
    assert again.state is RunState.SCHEDULED
    await fire(store, [again], now=at(11))
    worker = await register_worker(store, tenant.id)
    [attempt] = await store.attempts_lease(worker=worker, max=10, now=at(11))
    await store.attempts_fail_many(
        items=[FailItem(attempt.attempt_id, attempt.fencing_token, "still broken")], now=at(12)
    )
    done = await run_to_end_claimed(store, op)
    assert (done.matched, done.changed) == (2, 2)
    assert (await store.runs_get(tenant.id, first.id)).state is RunState.DEAD_LETTER
    assert (await store.runs_get(tenant.id, second.id)).state is RunState.SCHEDULED


async def test_a_due_range_selects_jobs_by_their_pending_run(store: Store) -> None:
    tenant = await make_tenant(store)
    # First due at T0 + 600, the pending run of each job: its next due instant.
    soon, _run = await create_job(store, tenant.id, due_at=at(600), name="soon")
    late, _run = await create_job(store, tenant.id, due_at=at(5000), name="late")
    op = await store.operations_create(
        tenant.id,
        action="pause",
        selector=Selector(due_after=at(300), due_before=at(900)),
        actor=OPS,
        now=at(1),
    )
    done = await run_to_end(store, op)
    assert (done.matched, done.changed) == (1, 1)
    assert (await store.jobs_get(tenant.id, soon.id)).state is JobState.PAUSED
    assert (await store.jobs_get(tenant.id, late.id)).state is JobState.ACTIVE


async def test_a_job_changed_since_acceptance_is_left_as_it_is(store: Store) -> None:
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=at(600), tags=["x"])
    op = await store.operations_create(
        tenant.id, action="pause", selector=Selector(tags_all=("x",)), actor=OPS, now=at(1)
    )
    # Someone pauses and resumes it meanwhile: their resume stands.
    await store.jobs_pause(tenant.id, job.id, now=at(2))
    await store.jobs_resume(tenant.id, job.id, now=at(3))
    done = await run_to_end(store, op, now_s=4)
    assert done.changed == 0
    assert (await store.jobs_get(tenant.id, job.id)).state is JobState.ACTIVE


# -- many operations: a tenant's limit, fair claims, leases, retention ------------------


async def test_a_tenant_at_its_limit_of_open_operations_is_refused(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    await create_job(store, tenant.id, due_at=at(60), tags=["x"])
    first, _second = [
        await store.operations_create(
            tenant.id,
            action="cancel",
            selector=Selector(tags_all=("x",)),
            actor=OPS,
            max_open=2,
            now=at(1),
        )
        for _ in range(2)
    ]
    with pytest.raises(TenantLimitError) as refused:
        await store.operations_create(
            tenant.id, action="pause", selector=Selector(all=True), actor=OPS, max_open=2, now=at(2)
        )
    assert "max_open_operations" in refused.value.message
    assert refused.value.details == {"limit": "max_open_operations", "open": 2, "max": 2}
    # Nothing stored: no operation, no audit record.
    assert len((await store.operations_list(tenant.id)).items) == 2
    assert len((await store.audit_list(tenant.id, action="bulk.pause")).items) == 0
    # Another tenant has its own count; one that ends makes room.
    await store.operations_create(
        other.id, action="pause", selector=Selector(all=True), actor=OPS, max_open=2, now=at(2)
    )
    await run_to_end(store, first, now_s=3)
    await store.operations_create(
        tenant.id, action="pause", selector=Selector(all=True), actor=OPS, max_open=2, now=at(4)
    )


async def test_claims_take_every_tenants_oldest_before_anyones_second(store: Store) -> None:
    busy, quiet = await make_tenant(store), await make_tenant(store)

    async def accept(tenant_id: uuid.UUID, second: float) -> Operation:
        return await store.operations_create(
            tenant_id, action="pause", selector=Selector(all=True), actor=OPS, now=at(second)
        )

    mine = [await accept(busy.id, s) for s in (1, 2, 3)]
    theirs = await accept(quiet.id, 4)
    claimed = []
    while (op := await store.operations_claim(owner="api-1", ttl=30, now=at(5))) is not None:
        claimed.append(op.id)
    assert claimed == [mine[0].id, theirs.id, mine[1].id, mine[2].id]


async def test_renewing_keeps_every_lease_held(store: Store) -> None:
    tenant = await make_tenant(store)
    ops = [
        await store.operations_create(
            tenant.id, action="pause", selector=Selector(all=True), actor=OPS, now=at(1)
        )
        for _ in range(2)
    ]
    for _ in ops:
        assert await store.operations_claim(owner="api-1", ttl=5, now=at(2)) is not None
    # Renewed at 6, both are held until 11: api-2 finds none free at 8.
    assert await store.operations_renew(owner="api-1", ttl=5, now=at(6)) == sorted(
        o.id for o in ops
    )
    assert await store.operations_claim(owner="api-2", ttl=5, now=at(8)) is None
    # Not renewed since: at 12 api-2 takes one over, and api-1 holds only the other.
    taken = await store.operations_claim(owner="api-2", ttl=5, now=at(12))
    assert taken is not None
    assert await store.operations_renew(owner="api-1", ttl=5, now=at(12)) == [
        o.id for o in ops if o.id != taken.id
    ]


async def test_retention_removes_only_operations_finished_long_enough_ago(store: Store) -> None:
    tenant = await make_tenant(store)
    await create_job(store, tenant.id, due_at=at(10**7), tags=["x"])

    async def accept() -> Operation:
        return await store.operations_create(
            tenant.id, action="cancel", selector=Selector(tags_all=("x",)), actor=OPS, now=at(1)
        )

    day = 86_400
    old = await run_to_end(store, await accept(), now_s=2)
    failed = await accept()
    await store.operations_claim(owner="api-1", ttl=30, now=at(3))
    await store.operations_fail(failed.id, owner="api-1", error="stopped", now=at(3))
    recent = await run_to_end(store, await accept(), now_s=20 * day)
    still_open = await accept()  # never claimed: open however old
    assert await store.operations_expire(retention_days=30, now=at(30 * day + 5)) == 2
    left = {o.id for o in (await store.operations_list(tenant.id)).items}
    assert left == {recent.id, still_open.id}
    assert old.id not in left
    # Who asked for them stays in the audit trail.
    assert len((await store.audit_list(tenant.id, action="bulk.cancel")).items) == 4
    assert await store.operations_expire(retention_days=30, now=at(30 * day + 5)) == 0
    with pytest.raises(ValueError, match="retention_days"):
        await store.operations_expire(retention_days=0)
