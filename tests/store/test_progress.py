"""Progress reports riding on heartbeats, and the progress deadline: an attempt of a run
whose job sets ``progress_timeout`` must report progress within it or the expiry sweep
ends it TIMED_OUT and the run is retried."""

from __future__ import annotations

from typing import Any

from cronwheel.domain.model import LeasedAttempt
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import CompleteItem, FailItem, HeartbeatItem, Store

from .helpers import (
    T0,
    at,
    create_job,
    fire,
    hold_all_shards,
    leased_run,
    make_tenant,
    register_worker,
)

STALE = 10**12
NO_PROGRESS = "no progress reported for 10 s (progress_timeout)"


def beat(attempt: LeasedAttempt) -> HeartbeatItem:
    return HeartbeatItem(attempt.attempt_id, attempt.fencing_token)


def report(
    attempt: LeasedAttempt, details: Any = None, *, token: int | None = None
) -> HeartbeatItem:
    return HeartbeatItem(
        attempt.attempt_id,
        attempt.fencing_token if token is None else token,
        progress=True,
        details=details,
    )


async def test_reports_are_kept_and_push_the_progress_deadline(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(
        store, tenant.id, timeout=600, heartbeat_timeout=30, progress_timeout=10
    )
    assert run.progress_timeout == attempt.progress_timeout == 10
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.progress_deadline, stored.progress_at, stored.progress_details) == (
        at(10),
        None,
        None,
    )

    # A plain beat keeps the lease alive but is no progress.
    [ok] = await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(5))
    assert ok.ok and ok.lease_expires_at == at(35)
    assert (await store.attempts_get(attempt.attempt_id)).progress_deadline == at(10)

    [ok] = await store.attempts_heartbeat_many(items=[report(attempt, {"rows": 100})], now=at(8))
    assert ok.ok and ok.lease_expires_at == at(38)
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.progress_deadline, stored.progress_at, stored.progress_details) == (
        at(18),
        at(8),
        {"rows": 100},
    )

    # Several items for one attempt: the last report wins, a plain beat after it erases
    # nothing, and a stale token's report changes nothing.
    items = [
        report(attempt, {"rows": 200}),
        report(attempt, {"rows": 300}),
        beat(attempt),
        report(attempt, {"rows": 999}, token=STALE),
    ]
    outcomes = await store.attempts_heartbeat_many(items=items, now=at(9))
    assert [o.ok for o in outcomes] == [True, True, True, False]
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.progress_deadline, stored.progress_at, stored.progress_details) == (
        at(19),
        at(9),
        {"rows": 300},
    )

    # A report without details replaces the last details too.
    await store.attempts_heartbeat_many(items=[report(attempt)], now=at(12))
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.progress_deadline, stored.progress_at, stored.progress_details) == (
        at(22),
        at(12),
        None,
    )
    # Pushed past the first deadline: the sweep has nothing to do before the new one.
    assert await store.attempts_expire(now=at(21)) == 0
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING


async def test_no_progress_within_the_timeout_is_timed_out_and_retried(store: Store) -> None:
    tenant = await make_tenant(store)
    retry = {"max_attempts": 2, "initial_delay": 5, "jitter": "none"}
    run, attempt = await leased_run(
        store, tenant.id, heartbeat_timeout=30, progress_timeout=10, retry=retry
    )
    # The worker is alive (it beats) but the handler reports nothing.
    await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(9))
    assert await store.attempts_expire(now=at(10)) == 0

    assert await store.attempts_expire(now=at(11)) == 1
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.finished_at, stored.error) == (
        AttemptState.TIMED_OUT,
        at(11),
        NO_PROGRESS,
    )
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.fire_at, after.last_error) == (
        RunState.SCHEDULED,
        at(16),
        NO_PROGRESS,
    )
    assert after.reason == f"retry 2 of 2 in 5.00 s: {NO_PROGRESS}"
    # The worker learns it on its next beat: its lease is gone.
    [late] = await store.attempts_heartbeat_many(items=[report(attempt, "late")], now=at(12))
    assert (late.ok, late.error_code) == (False, "stale_fencing_token")
    assert (await store.attempts_get(attempt.attempt_id)).progress_details is None

    # The retry gets a fresh progress deadline, and reporting keeps it going.
    assert [f.id for f in await fire(store, [after], now=at(16))] == [run.id]
    worker = await register_worker(store, tenant.id)
    [second] = await store.attempts_lease(worker=worker, max=1, now=at(16))
    assert (await store.attempts_get(second.attempt_id)).progress_deadline == at(26)
    await store.attempts_heartbeat_many(items=[report(second, {"step": 1})], now=at(24))
    assert await store.attempts_expire(now=at(30)) == 0
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(second.attempt_id, second.fencing_token, "ok")], now=at(31)
    )
    assert done.run_state is RunState.SUCCESS
    assert (await store.attempts_get(second.attempt_id)).progress_details == {"step": 1}


async def test_the_job_timeout_and_a_lost_lease_keep_their_own_errors(store: Store) -> None:
    """Three attempts ended by one sweep, each for its own reason, each with its error."""
    tenant = await make_tenant(store)
    once = {"max_attempts": 1}
    _, timed = await leased_run(
        store, tenant.id, timeout=10, heartbeat_timeout=60, progress_timeout=10, retry=once
    )
    _, stalled = await leased_run(
        store, tenant.id, timeout=600, heartbeat_timeout=60, progress_timeout=10, retry=once
    )
    _, lost = await leased_run(store, tenant.id, timeout=600, heartbeat_timeout=5, retry=once)
    assert await store.attempts_expire(now=at(11)) == 3
    errors = {
        a.attempt_id: ((got := await store.attempts_get(a.attempt_id)).state, got.error)
        for a in (timed, stalled, lost)
    }
    assert errors == {
        timed.attempt_id: (AttemptState.TIMED_OUT, "the attempt ran past the job's timeout"),
        stalled.attempt_id: (AttemptState.TIMED_OUT, NO_PROGRESS),
        lost.attempt_id: (AttemptState.LOST, "the worker stopped heartbeating: lease expired"),
    }


async def test_without_a_progress_timeout_reports_are_kept_and_nothing_times_out(
    store: Store,
) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, heartbeat_timeout=30)
    assert run.progress_timeout is None and attempt.progress_timeout is None
    await store.attempts_heartbeat_many(items=[report(attempt, ["a", 1])], now=at(20))
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.progress_deadline, stored.progress_at, stored.progress_details) == (
        None,
        at(20),
        ["a", 1],
    )
    assert await store.attempts_expire(now=at(49)) == 0
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING


async def test_a_failure_reported_past_the_progress_deadline_is_timed_out(store: Store) -> None:
    """As with the job's timeout: whether the worker's report or the sweep comes first
    does not change the record."""
    tenant = await make_tenant(store)
    run, attempt = await leased_run(
        store, tenant.id, progress_timeout=10, retry={"max_attempts": 2}
    )
    failure = FailItem(attempt.attempt_id, attempt.fencing_token, "stuck", True)
    [ok] = await store.attempts_fail_many(items=[failure], now=at(10))
    assert ok.ok and ok.run_state is RunState.SCHEDULED
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.error) == (AttemptState.TIMED_OUT, "stuck")
    assert (await store.runs_get(tenant.id, run.id)).last_error == "stuck"


async def test_a_started_reservation_gets_its_progress_deadline(store: Store) -> None:
    tenant = await make_tenant(store)
    _job, run = await create_job(store, tenant.id, due_at=at(3), now=T0, progress_timeout=10)
    await hold_all_shards(store)
    assert await store.runs_fire(run_ids=[run.id], node_id="node-a", now=T0, lead=5)
    worker = await register_worker(store, tenant.id)
    [reserved] = await store.attempts_lease(worker=worker, max=1, ahead=5, now=T0)
    assert (reserved.not_before, reserved.progress_timeout) == (at(3), 10)
    started = await store.attempts_start_many(
        worker_id=worker.id, tokens=[reserved.fencing_token], now=at(3.5)
    )
    assert started.started == [reserved.fencing_token]
    assert (await store.attempts_get(reserved.attempt_id)).progress_deadline == at(13.5)


async def test_every_occurrence_of_a_recurring_job_has_the_progress_timeout(store: Store) -> None:
    tenant = await make_tenant(store)
    job, run = await create_job(
        store, tenant.id, schedule={"cron": "*/5 * * * *"}, progress_timeout=7.5
    )
    assert [f.id for f in await fire(store, [run])] == [run.id]
    runs = (await store.runs_list(tenant.id)).items
    assert len(runs) == 2 and {r.job_id for r in runs} == {job.id}
    assert [r.progress_timeout for r in runs] == [7.5, 7.5]
