"""Reservations over HTTP: a run dispatched ahead of its instant is leased ahead
(``ahead``) as a reservation with ``not_before``, and started by its worker with
``POST /v1/workers/{id}/start`` (fencing tokens in, ``started`` / ``not_yet`` /
``refused`` tokens out) at that instant — unless a cancel or pause came first, or the
reservation lapsed. Both backends, on the in-process app; the store's own rules are in
tests/store/test_reservations.py, these tests prove the HTTP layer around them.

The database's clock is the test's (see clocked_store): it stands still at a far-future
instant, and a test moves it to the instants it needs instead of waiting for them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from answers import error_of, parse
from clocked_store import ManualClock, clocked

from cronwheel.settings import Settings
from cronwheel.store import Store

ADMIN_KEY = "test-admin-key-0123456789"
LEAD = 5.0  # dispatch_lead and lease_ahead_max: runs are handed out up to 5 s early
AHEAD_SECONDS = 2.0  # runs are created due this far ahead of the database clock
START_KEYS = {"started_at", "started", "not_yet", "refused", "now"}
T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)  # where the database's clock stands at first


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def store(store: Store, clock: ManualClock, store_url: str) -> Store:
    """The store as the API and the tests see it: its clock is ``clock``. (``store_url``
    named here too: pytest 8 parametrizes a fixture that overrides its own name only by
    what it names itself.)"""
    return clocked(store, clock)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        admin_key=ADMIN_KEY,
        max_payload_bytes=4096,
        lease_wait_max=10.0,
        heartbeat_interval=5.0,
        dispatch_lead=LEAD,
        lease_ahead_max=LEAD,
        # A start further ahead than this is "not yet" (the tests start early on purpose).
        start_ahead_max=0.5,
    )


# -- helpers ---------------------------------------------------------------------------


def ref(item: dict[str, Any]) -> dict[str, Any]:
    return {"attempt_id": item["attempt_id"], "fencing_token": item["fencing_token"]}


def nothing_started(
    *, not_yet: list[int] | None = None, refused: list[int] | None = None
) -> dict[str, Any]:
    """The answer to a start that started nothing."""
    return {"started_at": None, "started": [], "not_yet": not_yet or [], "refused": refused or []}


async def register(api: Any, headers: dict[str, str]) -> str:
    r = await api.client.post("/v1/workers", json={}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["lease_ahead_max"] == LEAD
    worker_id: str = r.json()["worker_id"]
    return worker_id


async def lease(
    api: Any, headers: dict[str, str], worker_id: str, **body: Any
) -> tuple[list[dict[str, Any]], datetime]:
    r = await api.client.post(f"/v1/workers/{worker_id}/lease", json=body, headers=headers)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"attempts", "now", "p0_reserved_slots"}, out
    return out["attempts"], parse(out["now"])


async def start(
    api: Any, headers: dict[str, str], worker_id: str, tokens: list[int]
) -> dict[str, Any]:
    """Start reservations by token; the whole answer, its shape checked."""
    r = await api.client.post(
        f"/v1/workers/{worker_id}/start", json={"fencing_tokens": tokens}, headers=headers
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    assert set(answer) == START_KEYS, answer
    assert (answer["started_at"] is None) == (answer["started"] == []), answer
    # The server's time as it answered (what a worker reckons instants by); the rest
    # is what the tests compare.
    assert parse(answer.pop("now")).tzinfo is not None
    return answer


async def run_detail(api: Any, tenant: Any, run_id: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/runs/{run_id}", headers=tenant.headers)
    assert r.status_code == 200, r.text
    detail: dict[str, Any] = r.json()
    return detail


async def ahead_run(api: Any, tenant: Any, **job: Any) -> dict[str, Any]:
    """A run due ``AHEAD_SECONDS`` from now by the database clock, dispatched ahead of
    it as a scheduler with ``dispatch_lead`` would: DISPATCHED, not yet leasable."""
    due = await api.store.db_now() + timedelta(seconds=AHEAD_SECONDS)
    created = await api.job(tenant, schedule={"at": due.isoformat()}, **job)
    await api.store.shard_leases_acquire(node_id="t", shards=range(256), ttl=60)
    run_id = uuid.UUID(created["first_run_id"])
    fired = await api.store.runs_fire(
        run_ids=[run_id], node_id="t", lead=api.app.state.settings.dispatch_lead
    )
    assert [f.id for f in fired] == [run_id]
    detail = await run_detail(api, tenant, created["first_run_id"])
    assert detail["state"] == "DISPATCHED" and parse(detail["due_at"]) > parse(
        detail["dispatched_at"]
    )
    return detail


def assert_untouched(detail: dict[str, Any]) -> None:
    """A reserved run: still DISPATCHED, no attempt made, not started."""
    assert (detail["state"], detail["attempt"], detail["started_at"]) == ("DISPATCHED", 0, None)
    assert detail["attempts"] == []


def transitions_of(detail: dict[str, Any]) -> list[tuple[str | None, str]]:
    return [
        (e["from_state"], e["to_state"]) for e in detail["events"] if e["kind"] == "run.transition"
    ]


# -- bad input -------------------------------------------------------------------------


async def test_lease_ahead_beyond_the_limit_or_negative_is_422_and_reserves_nothing(
    api: Any,
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    run = await ahead_run(api, t)
    before = await api.snapshot(t)
    for ahead, says in ((LEAD + 0.5, "at most 5 seconds"), (-1, "greater than or equal")):
        r = await api.client.post(
            f"/v1/workers/{wid}/lease", json={"max": 10, "ahead": ahead}, headers=worker
        )
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_request", "ahead"), err
        assert says in err["message"], err
    assert await api.snapshot(t) == before
    # Nothing was reserved: the worker reserves the run now, with a valid ``ahead``.
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    assert reserved["run_id"] == run["id"] and reserved["not_before"] is not None


async def test_start_refuses_empty_and_oversized_lists(api: Any, clock: ManualClock) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    await ahead_run(api, t)
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    clock.move_to(parse(reserved["not_before"]))  # due: only the 422s stop a start
    before = await api.snapshot(t)
    token = reserved["fencing_token"]
    too_many = [token] + [token + 1 + i for i in range(1000)]
    for tokens in ([], too_many):
        r = await api.client.post(
            f"/v1/workers/{wid}/start", json={"fencing_tokens": tokens}, headers=worker
        )
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_request", "fencing_tokens"), err
    # Missing, or in the earlier shape (attempt id and token per item): refused as well.
    for body in ({}, {"attempts": [ref(reserved)]}):
        r = await api.client.post(f"/v1/workers/{wid}/start", json=body, headers=worker)
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_request", "fencing_tokens"), err
    assert await api.snapshot(t) == before
    assert_untouched(await run_detail(api, t, reserved["run_id"]))
    # The most a request may name: a thousand, the reservation among them.
    answer = await start(api, worker, wid, too_many[:1000])
    assert answer["started"] == [token] and answer["not_yet"] == []
    assert answer["refused"] == too_many[1:1000]


async def test_start_for_an_unknown_or_another_tenants_worker_is_404(
    api: Any, clock: ManualClock
) -> None:
    a = await api.tenant()
    b = await api.tenant()
    wa = await api.key(a, "worker")
    wb = await api.key(b, "worker")
    wid = await register(api, wa)
    run = await ahead_run(api, a)
    [reserved], _ = await lease(api, wa, wid, max=10, ahead=LEAD)
    clock.move_to(parse(reserved["not_before"]))  # due: only the 404s stop a start
    before = await api.snapshot(a)
    body = {"fencing_tokens": [reserved["fencing_token"]]}
    for worker_id, headers in (
        (wid, wb),  # another tenant's worker, with a tenant key
        (str(uuid.uuid4()), wa),
        (str(uuid.uuid4()), api.admin),
        ("not-an-id", wa),
    ):
        r = await api.client.post(f"/v1/workers/{worker_id}/start", json=body, headers=headers)
        assert r.status_code == 404, (worker_id, r.text)
        assert error_of(r)["code"] == "not_found"
    # Workers only: an operator key may not start anything.
    r = await api.client.post(f"/v1/workers/{wid}/start", json=body, headers=a.headers)
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden", r.text
    assert await api.snapshot(a) == before
    assert_untouched(await run_detail(api, a, run["id"]))
    # The reservation survived all of it: its own worker starts it.
    ok = await start(api, wa, wid, [reserved["fencing_token"]])
    assert (ok["started"], ok["not_yet"], ok["refused"]) == ([reserved["fencing_token"]], [], [])
    detail = await run_detail(api, a, run["id"])
    assert detail["state"] == "RUNNING"
    assert parse(detail["started_at"]) == parse(ok["started_at"])


# -- the life of a reservation ---------------------------------------------------------


async def test_a_reservation_is_started_at_its_instant_and_completed(
    api: Any, clock: ManualClock
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid, other = await register(api, worker), await register(api, worker)
    run = await ahead_run(api, t, timeout=600, heartbeat_timeout=20, payload={"k": "v"})
    due = parse(run["due_at"])

    # Without ``ahead`` the run is not leasable before its instant.
    got, _ = await lease(api, worker, wid, max=10)
    assert got == []
    db_before = await api.store.db_now()
    [reserved], now = await lease(api, worker, wid, max=10, ahead=LEAD)
    db_after = await api.store.db_now()
    assert (reserved["run_id"], reserved["attempt"], reserved["payload"]) == (
        run["id"],
        1,
        {"k": "v"},
    )
    assert parse(reserved["not_before"]) == due == parse(reserved["due_at"])
    # Until it starts, the lease lapses at the instant plus the heartbeat timeout, and
    # the deadline assumes a start at the instant.
    assert parse(reserved["lease_expires_at"]) == due + timedelta(seconds=20)
    assert parse(reserved["deadline"]) == due + timedelta(seconds=600)
    # ``now`` is the server's time (the database's, as the API reckons it) and the
    # instant is still ahead of it.
    slack = timedelta(seconds=0.5)
    assert db_before - slack <= now <= db_after + slack
    assert now < due
    assert_untouched(await run_detail(api, t, run["id"]))
    token = reserved["fencing_token"]

    # Too early: not yet, nothing changes.
    before = await api.snapshot(t)
    assert await start(api, worker, wid, [token]) == nothing_started(not_yet=[token])
    assert await api.snapshot(t) == before
    assert_untouched(await run_detail(api, t, run["id"]))

    clock.move_to(due)
    # Due, but not the other worker's: refused to it (beside an unknown token), and the
    # reservation is untouched.
    unknown = token + 1_000_000
    assert await start(api, worker, other, [token, unknown]) == nothing_started(
        refused=[token, unknown]
    )
    assert await api.snapshot(t) == before
    assert_untouched(await run_detail(api, t, run["id"]))

    answer = await start(api, worker, wid, [token])
    assert (answer["started"], answer["not_yet"], answer["refused"]) == ([token], [], [])
    started_at = parse(answer["started_at"])
    assert started_at == due  # the clock stands at the instant
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["attempt"]) == ("RUNNING", 1)
    assert parse(detail["started_at"]) == started_at
    [attempt] = detail["attempts"]
    assert (attempt["id"], attempt["fencing_token"], attempt["number"], attempt["state"]) == (
        reserved["attempt_id"],
        token,
        1,
        "RUNNING",
    )
    assert attempt["worker_id"] == wid and parse(attempt["started_at"]) == started_at
    # The lease and deadline run from the start, not from the instant.
    assert parse(attempt["lease_expires_at"]) == started_at + timedelta(seconds=20)
    assert parse(attempt["deadline"]) == started_at + timedelta(seconds=600)

    # From here it is an ordinary attempt.
    r = await api.client.post(
        "/v1/attempts/batch",
        json={"completions": [{**ref(reserved), "result": {"rows": 3}}]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    [done] = r.json()["completions"]
    assert (done["ok"], done["run_state"]) == (True, "SUCCESS"), done
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["result"]) == ("SUCCESS", {"rows": 3})
    assert [a["state"] for a in detail["attempts"]] == ["SUCCEEDED"]
    assert transitions_of(detail) == [
        (None, "SCHEDULED"),
        ("SCHEDULED", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    # Started once: a second start is refused and changes nothing.
    before = await api.snapshot(t)
    assert await start(api, worker, wid, [token]) == nothing_started(refused=[token])
    assert await api.snapshot(t) == before


async def test_a_start_within_start_ahead_max_begins_the_run_at_its_instant(
    api: Any, clock: ManualClock
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    run = await ahead_run(api, t, timeout=600, heartbeat_timeout=20)
    due = parse(run["due_at"])
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    token = reserved["fencing_token"]

    clock.move_to(due - timedelta(seconds=0.25))  # within start_ahead_max (0.5 s)
    answer = await start(api, worker, wid, [token])
    assert (answer["started"], answer["not_yet"], answer["refused"]) == ([token], [], [])
    # Started now, begun at its instant: the run, its attempt, its lease and deadline.
    assert parse(answer["started_at"]) == due
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], parse(detail["started_at"])) == ("RUNNING", due)
    [attempt] = detail["attempts"]
    assert parse(attempt["started_at"]) == due
    assert parse(attempt["lease_expires_at"]) == due + timedelta(seconds=20)
    # A cancel now comes after the start: requested of the running run, not a refusal.
    cancelled = await api.client.post(
        f"/v1/runs/{run['id']}/cancel", json={}, headers=await api.key(t, "operator")
    )
    assert cancelled.status_code in (200, 202), cancelled.text
    assert (await run_detail(api, t, run["id"]))["state"] == "RUNNING"


async def test_a_cancel_before_the_instant_wins_over_the_start(
    api: Any, clock: ManualClock
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    run = await ahead_run(api, t)
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)

    r = await api.client.post(
        f"/v1/runs/{run['id']}/cancel", json={"reason": "not today"}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CANCELLED"  # not started: cancelled at once
    clock.move_to(parse(reserved["not_before"]))
    token = reserved["fencing_token"]
    assert await start(api, worker, wid, [token]) == nothing_started(refused=[token])
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["attempt"], detail["started_at"]) == ("CANCELLED", 0, None)
    assert detail["attempts"] == []
    transitions = transitions_of(detail)
    assert transitions[-1] == ("DISPATCHED", "CANCELLED")
    assert ("DISPATCHED", "RUNNING") not in transitions


async def test_a_pause_before_the_instant_wins_over_the_start(api: Any, clock: ManualClock) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    run = await ahead_run(api, t)
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)

    r = await api.client.post(f"/v1/jobs/{run['job_id']}/pause", headers=t.headers)
    assert r.status_code == 200, r.text
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["attempt"]) == ("SCHEDULED", 0)  # taken back
    clock.move_to(parse(reserved["not_before"]))
    token = reserved["fencing_token"]
    assert await start(api, worker, wid, [token]) == nothing_started(refused=[token])
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["attempt"], detail["started_at"]) == ("SCHEDULED", 0, None)
    assert detail["attempts"] == []
    assert ("DISPATCHED", "RUNNING") not in transitions_of(detail)


async def test_a_started_item_and_a_refused_one_in_one_request(
    api: Any, clock: ManualClock
) -> None:
    """Each token has its own outcome: a cancelled reservation does not stop the other
    from starting."""
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    first = await ahead_run(api, t, name="first")
    second = await ahead_run(api, t, name="second")
    reserved = {r["run_id"]: r for r in (await lease(api, worker, wid, max=10, ahead=LEAD))[0]}
    assert set(reserved) == {first["id"], second["id"]}
    r = await api.client.post(f"/v1/runs/{first['id']}/cancel", headers=t.headers)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED", r.text
    clock.move_to(max(parse(x["not_before"]) for x in reserved.values()))
    cancelled = reserved[first["id"]]["fencing_token"]
    kept = reserved[second["id"]]["fencing_token"]
    answer = await start(api, worker, wid, [cancelled, kept])
    assert (answer["started"], answer["not_yet"], answer["refused"]) == ([kept], [], [cancelled])
    assert (await run_detail(api, t, first["id"]))["state"] == "CANCELLED"
    detail = await run_detail(api, t, second["id"])
    assert detail["state"] == "RUNNING"
    assert [(a["id"], a["fencing_token"]) for a in detail["attempts"]] == [
        (reserved[second["id"]]["attempt_id"], kept)
    ]
    assert parse(detail["started_at"]) == parse(answer["started_at"])


async def test_a_lapsed_reservation_is_voided_by_the_expiry_sweep_and_taken(
    api: Any, clock: ManualClock
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid, other = await register(api, worker), await register(api, worker)
    run = await ahead_run(api, t, heartbeat_timeout=1)
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    expiry = parse(reserved["not_before"]) + timedelta(seconds=1)
    assert parse(reserved["lease_expires_at"]) == expiry

    # Held until its expiry: the sweep leaves it be, and no one else may lease it.
    assert await api.store.attempts_expire() == 0
    got, _ = await lease(api, worker, other, max=10, ahead=LEAD)
    assert got == []

    # Still held at the very instant of its expiry.
    clock.move_to(expiry)
    assert await api.store.attempts_expire() == 0
    clock.advance(0.001)
    # Past its expiry it is out of the queue still, until the sweep voids it.
    got, _ = await lease(api, worker, other, max=10)
    assert got == []
    assert_untouched(await run_detail(api, t, run["id"]))
    assert await api.store.attempts_expire() == 1
    assert_untouched(await run_detail(api, t, run["id"]))

    # Anyone's now: due, the other worker leases it and it starts at once, under a new
    # token; the lapsed reservation's start is refused.
    [taken], _ = await lease(api, worker, other, max=10)
    assert (taken["run_id"], taken["not_before"], taken["attempt"]) == (run["id"], None, 1)
    assert taken["fencing_token"] > reserved["fencing_token"]
    assert taken["attempt_id"] != reserved["attempt_id"]
    token = reserved["fencing_token"]
    assert await start(api, worker, wid, [token]) == nothing_started(refused=[token])
    detail = await run_detail(api, t, run["id"])
    assert (detail["state"], detail["attempt"]) == ("RUNNING", 1)
    [attempt] = detail["attempts"]
    assert (attempt["id"], attempt["fencing_token"], attempt["worker_id"]) == (
        taken["attempt_id"],
        taken["fencing_token"],
        other,
    )


async def test_handing_a_reservation_back_frees_the_run_at_once(
    api: Any, clock: ManualClock
) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid, other = await register(api, worker), await register(api, worker)
    run = await ahead_run(api, t)
    [reserved], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    got, _ = await lease(api, worker, other, max=10, ahead=LEAD)
    assert got == []  # held for the first worker

    r = await api.client.post(
        "/v1/attempts/batch", json={"releases": [ref(reserved)]}, headers=worker
    )
    assert r.status_code == 200, r.text
    [released] = r.json()["releases"]
    assert (released["attempt_id"], released["ok"], released["run_state"]) == (
        reserved["attempt_id"],
        True,
        "DISPATCHED",
    )
    assert_untouched(await run_detail(api, t, run["id"]))
    # Free at once, before its instant: the other worker reserves it under a new token.
    [again], _ = await lease(api, worker, other, max=10, ahead=LEAD)
    assert again["run_id"] == run["id"] and again["not_before"] == reserved["not_before"]
    assert again["fencing_token"] > reserved["fencing_token"]

    # Deregistering hands back the reservations the worker holds.
    r = await api.client.delete(f"/v1/workers/{other}", headers=worker)
    assert r.status_code == 200, r.text
    assert r.json() == {"worker_id": other, "released": 1}
    assert_untouched(await run_detail(api, t, run["id"]))

    clock.move_to(parse(reserved["not_before"]))
    # Both handed back: neither starts (the deregistered worker starts nothing at all).
    token = reserved["fencing_token"]
    assert await start(api, worker, wid, [token]) == nothing_started(refused=[token])
    r = await api.client.post(
        f"/v1/workers/{other}/start",
        json={"fencing_tokens": [again["fencing_token"]]},
        headers=worker,
    )
    assert r.status_code == 410 and r.json()["error"]["code"] == "worker_deregistered"
    assert_untouched(await run_detail(api, t, run["id"]))
    # The first worker leases it once more; due now, it starts at once.
    [third], _ = await lease(api, worker, wid, max=10, ahead=LEAD)
    assert (third["run_id"], third["not_before"], third["attempt"]) == (run["id"], None, 1)
    detail = await run_detail(api, t, run["id"])
    assert detail["state"] == "RUNNING"
    assert [a["id"] for a in detail["attempts"]] == [third["attempt_id"]]


async def test_reserve_beyond_max_through_the_api_and_its_bad_values(api: Any) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    runs = [await ahead_run(api, t) for _ in range(3)]
    before = await api.snapshot(t)
    for body, says in (
        ({"max": 1, "reserve": 5}, "set ahead too"),
        ({"max": 1, "ahead": LEAD, "reserve": 1001}, "less than or equal"),
        ({"max": 1, "ahead": LEAD, "reserve": -1}, "greater than or equal"),
    ):
        r = await api.client.post(f"/v1/workers/{wid}/lease", json=body, headers=worker)
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_request", "reserve"), err
        assert says in err["message"], err
    assert await api.snapshot(t) == before
    # ``max`` 1 filled by one reservation, ``reserve`` takes the other two.
    reserved, _ = await lease(api, worker, wid, max=1, ahead=LEAD, reserve=5)
    assert sorted(a["run_id"] for a in reserved) == sorted(r["id"] for r in runs)
    assert all(a["not_before"] is not None for a in reserved)
