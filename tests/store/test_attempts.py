"""Attempts after the lease: heartbeats, results, failures, release and expiry, each
guarded by the fencing token."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from cronwheel.domain.errors import NotFoundError
from cronwheel.domain.model import LeasedAttempt, Run
from cronwheel.domain.states import AttemptState, JobState, RunState
from cronwheel.store import CompleteItem, FailItem, HeartbeatItem, Store

from .helpers import (
    T0,
    at,
    events_of,
    fire,
    leased_run,
    make_tenant,
    register_worker,
    transitions_of,
)

# A token no attempt has: tokens are handed out from 1 upwards.
STALE = 10**12


def beat(attempt: LeasedAttempt, token: int | None = None) -> HeartbeatItem:
    return HeartbeatItem(attempt.attempt_id, attempt.fencing_token if token is None else token)


def done(attempt: LeasedAttempt, result: object = None) -> CompleteItem:
    return CompleteItem(attempt.attempt_id, attempt.fencing_token, result)


def fail(attempt: LeasedAttempt, error: str = "boom", *, retryable: bool = True) -> FailItem:
    return FailItem(attempt.attempt_id, attempt.fencing_token, error, retryable)


async def _lease_again(store: Store, run: Run, now: datetime) -> LeasedAttempt:
    """Fire a rescheduled run at ``now`` and lease it."""
    assert [f.id for f in await fire(store, [run], now=now)] == [run.id]
    worker = await register_worker(store, run.tenant_id, pool=run.pool)
    [leased] = await store.attempts_lease(worker=worker, max=1, now=now)
    assert leased.run_id == run.id
    return leased


async def test_heartbeat_extends_the_lease(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, heartbeat_timeout=20)
    assert attempt.lease_expires_at == at(20)

    [ok] = await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(15))
    assert (ok.attempt_id, ok.ok, ok.error_code) == (attempt.attempt_id, True, None)
    assert ok.lease_expires_at == at(35)
    assert not ok.cancel_requested
    assert ok.run_state is RunState.RUNNING
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.lease_expires_at, stored.heartbeat_at) == (at(35), at(15))

    # Stale and unknown tokens are refused item by item and change nothing.
    unknown = HeartbeatItem(uuid.uuid4(), attempt.fencing_token)
    outcomes = await store.attempts_heartbeat_many(
        items=[beat(attempt, STALE), unknown, beat(attempt)], now=at(30)
    )
    assert [(o.attempt_id, o.ok) for o in outcomes] == [
        (attempt.attempt_id, False),
        (unknown.attempt_id, False),
        (attempt.attempt_id, True),
    ]
    assert outcomes[0].error_code == "stale_fencing_token"
    assert outcomes[1].error_code in ("not_found", "stale_fencing_token")
    assert outcomes[2].lease_expires_at == at(50)

    [refused] = await store.attempts_heartbeat_many(items=[beat(attempt, STALE)], now=at(40))
    assert not refused.ok
    assert refused.error_code
    assert (await store.attempts_get(attempt.attempt_id)).lease_expires_at == at(50)
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.RUNNING
    with pytest.raises(NotFoundError):
        await store.attempts_get(unknown.attempt_id)


async def test_complete_finishes_run_and_one_off_job(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id)
    before = await store.runs_get(tenant.id, run.id)

    # A stale token changes nothing.
    stale = CompleteItem(attempt.attempt_id, STALE, {"zombie": True})
    [refused] = await store.attempts_complete_many(items=[stale], now=at(1))
    assert (refused.ok, refused.error_code) == (False, "stale_fencing_token")
    assert await store.runs_get(tenant.id, run.id) == before
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING
    assert len(await events_of(store, tenant.id, run_id=run.id)) == 3

    [ok] = await store.attempts_complete_many(items=[done(attempt, {"rows": 3})], now=at(2))
    assert (ok.attempt_id, ok.ok) == (attempt.attempt_id, True)

    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.finished_at, after.result) == (
        RunState.SUCCESS,
        at(2),
        {"rows": 3},
    )
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.finished_at, stored.result) == (
        AttemptState.SUCCEEDED,
        at(2),
        {"rows": 3},
    )
    job = await store.jobs_get(tenant.id, run.job_id)
    assert job.state is JobState.FINISHED
    assert job.next_due_at is None
    assert await transitions_of(store, tenant.id, run.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    history = await events_of(store, tenant.id, run_id=run.id)
    assert [e.at for e in history] == [T0, T0, T0, at(2)]
    # Oldest first, page by page.
    first = await store.events_list(tenant.id, run_id=run.id, limit=3)
    assert first.next_cursor is not None
    rest = await store.events_list(tenant.id, run_id=run.id, cursor=first.next_cursor, limit=3)
    assert (first.items + rest.items, rest.next_cursor) == (history, None)

    # Once finished, the attempt accepts nothing more.
    [again] = await store.attempts_complete_many(items=[done(attempt, "other")], now=at(3))
    [late_fail] = await store.attempts_fail_many(items=[fail(attempt)], now=at(3))
    [late_beat] = await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(3))
    assert not again.ok
    assert not late_fail.ok
    assert not late_beat.ok
    assert await store.runs_get(tenant.id, run.id) == after
    assert await events_of(store, tenant.id, run_id=run.id) == history


async def test_mispaired_tokens_refuse_only_their_items(store: Store) -> None:
    """A batch where two items swap tokens: those two are stale, the rest applies."""
    tenant = await make_tenant(store)
    worker = await register_worker(store, tenant.id)
    leased = [(await leased_run(store, tenant.id, worker=worker))[1] for _ in range(3)]
    good, b, c = leased
    items = [
        done(good),
        CompleteItem(b.attempt_id, c.fencing_token),
        CompleteItem(c.attempt_id, b.fencing_token),
    ]
    outcomes = await store.attempts_complete_many(items=items, now=at(1))
    assert [o.ok for o in outcomes] == [True, False, False]
    assert (await store.runs_get(tenant.id, good.run_id)).state is RunState.SUCCESS
    for other in (b, c):
        assert (await store.runs_get(tenant.id, other.run_id)).state is RunState.RUNNING


async def test_fail_retries_with_backoff_then_dead_letters(store: Store) -> None:
    tenant = await make_tenant(store)
    retry = {"max_attempts": 3, "initial_delay": 10, "multiplier": 2, "jitter": "equal"}
    run, attempt = await leased_run(store, tenant.id, retry=retry)
    tokens = [attempt.fencing_token]

    now = at(1)
    for number, base in ((1, 10.0), (2, 20.0)):
        [ok] = await store.attempts_fail_many(items=[fail(attempt, f"boom {number}")], now=now)
        assert ok.ok
        after = await store.runs_get(tenant.id, run.id)
        assert after.state is RunState.SCHEDULED
        # Equal jitter: between half the backoff and all of it.
        assert now + timedelta(seconds=base / 2) <= after.fire_at <= now + timedelta(seconds=base)
        assert (after.attempt, after.last_error, after.finished_at) == (
            number,
            f"boom {number}",
            None,
        )
        assert after.reason
        assert after.due_at == run.due_at
        stored = await store.attempts_get(attempt.attempt_id)
        assert (stored.state, stored.error, stored.finished_at) == (
            AttemptState.FAILED,
            f"boom {number}",
            now,
        )
        due = await store.runs_due_scan(
            shards=[run.shard], until=after.fire_at + timedelta(seconds=1)
        )
        assert [(d.id, d.fire_at) for d in due] == [(run.id, after.fire_at)]
        now = after.fire_at
        attempt = await _lease_again(store, after, now)
        assert attempt.number == number + 1
        tokens.append(attempt.fencing_token)
        now += timedelta(seconds=1)

    [ok] = await store.attempts_fail_many(items=[fail(attempt, "boom 3")], now=now)
    assert ok.ok
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.finished_at, after.attempt) == (RunState.DEAD_LETTER, now, 3)
    assert after.reason
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3
    assert [(a.number, a.state) for a in await store.attempts_list(tenant.id, run_id=run.id)] == [
        (1, AttemptState.FAILED),
        (2, AttemptState.FAILED),
        (3, AttemptState.FAILED),
    ]
    assert (await transitions_of(store, tenant.id, run.id))[-1] == ("RUNNING", "DEAD_LETTER")


async def test_fail_without_retry_is_final(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, retry={"max_attempts": 5})
    before = await store.runs_get(tenant.id, run.id)
    [refused] = await store.attempts_fail_many(
        items=[FailItem(attempt.attempt_id, STALE, "zombie", False)], now=at(1)
    )
    assert not refused.ok
    assert await store.runs_get(tenant.id, run.id) == before
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RUNNING

    [ok] = await store.attempts_fail_many(
        items=[fail(attempt, "bad input", retryable=False)], now=at(1)
    )
    assert ok.ok
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.finished_at, after.last_error) == (
        RunState.FAILED,
        at(1),
        "bad input",
    )
    assert after.reason
    assert (await transitions_of(store, tenant.id, run.id))[-1] == ("RUNNING", "FAILED")

    [stale] = await store.attempts_fail_many(items=[fail(attempt)], now=at(2))
    assert not stale.ok
    assert await store.runs_get(tenant.id, run.id) == after


async def test_release_hands_the_run_back_without_counting(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, retry={"max_attempts": 2})
    [ok] = await store.attempts_release_many(items=[beat(attempt)], now=at(1))
    assert ok.ok
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.attempt, after.finished_at) == (RunState.DISPATCHED, 0, None)
    assert (await store.attempts_get(attempt.attempt_id)).state is AttemptState.RELEASED
    [again] = await store.attempts_release_many(items=[beat(attempt)], now=at(1))
    assert not again.ok

    # Another worker takes it over; the released try did not use up an attempt.
    worker = await register_worker(store, tenant.id)
    [second] = await store.attempts_lease(worker=worker, max=1, now=at(2))
    assert second.run_id == run.id
    assert second.fencing_token > attempt.fencing_token
    assert (await store.runs_get(tenant.id, run.id)).attempt == 1
    [failed] = await store.attempts_fail_many(items=[fail(second)], now=at(3))
    assert failed.ok
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.SCHEDULED
    assert await transitions_of(store, tenant.id, run.id) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SCHEDULED"),
    ]


async def test_expired_lease_is_lost_and_retried(store: Store) -> None:
    tenant = await make_tenant(store)
    retry = {"max_attempts": 2, "initial_delay": 5, "jitter": "none"}
    run, attempt = await leased_run(store, tenant.id, retry=retry, heartbeat_timeout=30)

    assert await store.attempts_expire(now=at(29)) == 0
    assert (await store.runs_get(tenant.id, run.id)).state is RunState.RUNNING

    assert await store.attempts_expire(now=at(31)) == 1
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.finished_at) == (AttemptState.LOST, at(31))
    assert stored.error
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.fire_at, after.finished_at) == (RunState.SCHEDULED, at(36), None)
    assert after.reason
    assert await store.attempts_expire(now=at(32)) == 0

    # The zombie comes back: its result and heartbeats are refused.
    [late] = await store.attempts_complete_many(items=[done(attempt, "late")], now=at(33))
    [late_beat] = await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(33))
    assert not late.ok
    assert not late_beat.ok
    assert await store.runs_get(tenant.id, run.id) == after

    # The retry's lease expires too: no attempts are left.
    second = await _lease_again(store, after, at(36))
    assert second.fencing_token > attempt.fencing_token
    assert await store.attempts_expire(now=at(67)) == 1
    final = await store.runs_get(tenant.id, run.id)
    assert (final.state, final.finished_at) == (RunState.DEAD_LETTER, at(67))
    assert (await transitions_of(store, tenant.id, run.id))[-1] == ("RUNNING", "DEAD_LETTER")


async def test_deadline_passed_is_timed_out(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(
        store, tenant.id, timeout=10, heartbeat_timeout=30, retry={"max_attempts": 1}
    )
    [ok] = await store.attempts_heartbeat_many(items=[beat(attempt)], now=at(5))
    assert ok.lease_expires_at == at(35)  # the lease is fine; the deadline is not

    assert await store.attempts_expire(now=at(9)) == 0
    assert await store.attempts_expire(now=at(11)) == 1
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.finished_at) == (AttemptState.TIMED_OUT, at(11))
    after = await store.runs_get(tenant.id, run.id)
    assert (after.state, after.finished_at) == (RunState.DEAD_LETTER, at(11))
    [late] = await store.attempts_complete_many(items=[done(attempt)], now=at(12))
    assert not late.ok
    assert await store.runs_get(tenant.id, run.id) == after


async def test_a_failure_reported_past_the_deadline_is_timed_out(store: Store) -> None:
    """A worker enforcing the timeout itself reports a failure a moment after the
    deadline: the record is the same as when the expiry sweep gets there first."""
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, timeout=10, retry={"max_attempts": 2})
    [ok] = await store.attempts_fail_many(items=[fail(attempt, "deadline exceeded")], now=at(10))
    assert ok.ok and ok.run_state is RunState.SCHEDULED
    stored = await store.attempts_get(attempt.attempt_id)
    assert (stored.state, stored.error) == (AttemptState.TIMED_OUT, "deadline exceeded")
    events = await events_of(store, tenant.id, run_id=run.id)
    assert events[-1].data["attempt_state"] == "TIMED_OUT"

    # Before the deadline a failure stays a failure.
    second = await _lease_again(store, await store.runs_get(tenant.id, run.id), at(40))
    await store.attempts_fail_many(items=[fail(second)], now=at(49))
    assert (await store.attempts_get(second.attempt_id)).state is AttemptState.FAILED
