"""The worker protocol over HTTP: register, lease (and long-poll), heartbeat, complete,
fail, release, batch — with fencing tokens and tenant isolation."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
from answers import error_of, parse

from cronwheel.api.app import stop_long_polls
from cronwheel.store import Store
from cronwheel.testing import wait_until_async


async def register(api, headers: dict[str, str], **body: Any) -> str:
    r = await api.client.post("/v1/workers", json=body, headers=headers)
    assert r.status_code == 200, r.text
    worker_id: str = r.json()["worker_id"]
    return worker_id


async def lease(api, headers: dict[str, str], worker_id: str, **body: Any) -> list[dict[str, Any]]:
    r = await api.client.post(f"/v1/workers/{worker_id}/lease", json=body, headers=headers)
    assert r.status_code == 200, r.text
    attempts: list[dict[str, Any]] = r.json()["attempts"]
    return attempts


async def ready_attempt(api, tenant, **job: Any) -> tuple[dict[str, str], str, dict[str, Any]]:
    """A job whose run a fresh worker of ``tenant`` has leased."""
    created = await api.job(tenant, **job)
    await api.fire()
    headers = await api.key(tenant, "worker")
    wid = await register(api, headers)
    [leased] = await lease(api, headers, wid, max=10)
    assert leased["run_id"] == created["first_run_id"]
    return headers, wid, leased


async def test_register(api) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    r = await api.client.post(
        "/v1/workers",
        json={
            "pool": "gpu",
            "capabilities": ["cuda"],
            "tags": ["eu"],
            "capacity": 4,
            "name": "w-1",
        },
        headers=worker,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tenant_id"] == t.id
    assert body["heartbeat_interval"] == 5.0 and body["lease_wait_max"] == 10.0
    stored = await api.store.workers_get(uuid.UUID(body["worker_id"]))
    assert stored.pool == "gpu" and stored.capabilities == ["cuda"] and stored.capacity == 4

    r = await api.client.post("/v1/workers", json={"pool": "default"}, headers=api.admin)
    assert r.status_code == 200 and r.json()["tenant_id"] is None

    for headers in (t.headers, await api.key(t, "viewer")):
        r = await api.client.post("/v1/workers", json={}, headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    for body, field in [
        ({"capacity": 0}, "capacity"),
        ({"pool": ""}, "pool"),
        ({"capabilities": "cuda"}, "capabilities"),
        ({"colour": 1}, "colour"),
    ]:
        r = await api.client.post("/v1/workers", json=body, headers=worker)
        assert r.status_code == 422 and error_of(r)["field"] == field, r.text


async def test_lease_without_wait_answers_at_once(api) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    assert await lease(api, worker, wid, max=5, wait=0) == []

    job = await api.job(t, payload={"k": "v"}, schedule={"asap": True})
    assert await lease(api, worker, wid, max=5) == []  # not fired yet
    await api.fire()
    [got] = await lease(api, worker, wid, max=5)
    assert got["run_id"] == job["first_run_id"] and got["job_id"] == job["id"]
    assert got["tenant_id"] == t.id and got["attempt"] == 1
    assert got["task"] == "t.run" and got["payload"] == {"k": "v"}
    assert got["heartbeat_timeout"] == 25.0 and isinstance(got["fencing_token"], int)
    assert parse(got["lease_expires_at"]) < parse(got["deadline"])
    parse(got["due_at"])
    run = await api.store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
    assert run.state == "RUNNING"
    assert await lease(api, worker, wid, max=5) == []  # leased once only


async def test_long_poll_wakes_when_a_run_is_dispatched(api, app) -> None:
    # Without a notification the poll would sleep past the whole wait: only the wake-up
    # can make it answer in time.
    app.state.api.lease_poll_interval = 60.0
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    notifier = app.state.api.notifier

    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/lease", json={"max": 2, "wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: notifier.waiting == 1)
    job = await api.job(t)
    loop = asyncio.get_running_loop()
    fired_at = loop.time()
    assert len(await api.fire()) == 1
    r = await asyncio.wait_for(poll, timeout=10)
    assert r.status_code == 200, r.text
    [got] = r.json()["attempts"]
    assert got["run_id"] == job["first_run_id"]
    assert loop.time() - fired_at < 5
    assert notifier.waiting == 0


async def test_long_poll_wakes_at_the_instant_of_a_run_dispatched_ahead(api, app) -> None:
    """Runs dispatched ahead of their instants are leased at those instants: the ready
    notice carries each, and waiting long-polls wake then (their re-poll timer is out
    of reach) — for every run of the batch, not only its first."""
    app.state.api.lease_poll_interval = 60.0
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    due = await api.store.db_now() + timedelta(seconds=2)
    first = await api.job(t, schedule={"at": due.isoformat()})
    second = await api.job(t, schedule={"at": (due + timedelta(seconds=1)).isoformat()})

    def poll() -> asyncio.Task[httpx.Response]:
        return asyncio.create_task(
            api.client.post(f"/v1/workers/{wid}/lease", json={"max": 2, "wait": 10}, headers=worker)
        )

    waiting = poll()
    await wait_until_async(lambda: app.state.api.notifier.waiting == 1)
    await api.store.shard_leases_acquire(node_id="t", shards=range(256), ttl=60)
    ids = [uuid.UUID(first["first_run_id"]), uuid.UUID(second["first_run_id"])]
    fired = await api.store.runs_fire(run_ids=ids, node_id="t", lead=5)
    assert len(fired) == 2 and all(f.dispatched_at < due for f in fired)  # ahead
    for job, instant in ((first, due), (second, due + timedelta(seconds=1))):
        r = await asyncio.wait_for(waiting, timeout=20)
        assert r.status_code == 200, r.text
        [got] = r.json()["attempts"]
        assert got["run_id"] == job["first_run_id"]
        run = await api.store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
        assert run.started_at is not None and run.started_at >= instant  # never before it
        # Woken for it, not by the long-poll's end 10 s later.
        assert run.started_at < instant + timedelta(seconds=5)
        waiting = poll()
    waiting.cancel()


async def test_long_poll_ignores_other_pools_and_times_out_empty(api, app) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, pool="gpu")
    await api.job(t)  # pool "default"
    await api.fire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await lease(api, worker, wid, max=1, wait=0.3) == []
    assert loop.time() - started >= 0.3


async def test_lease_wait_and_worker_ids_are_checked(api) -> None:
    a = await api.tenant()
    b = await api.tenant()
    wa = await api.key(a, "worker")
    wb = await api.key(b, "worker")
    wid = await register(api, wa)
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"wait": 11}, headers=wa)
    assert r.status_code == 422 and error_of(r)["field"] == "wait"
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 0}, headers=wa)
    assert r.status_code == 422 and error_of(r)["field"] == "max"
    for other in (wid, str(uuid.uuid4()), "not-an-id"):
        r = await api.client.post(f"/v1/workers/{other}/lease", json={}, headers=wb)
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={}, headers=a.headers)
    assert r.status_code == 403


async def test_tenant_workers_lease_only_their_tenants_runs(api) -> None:
    a = await api.tenant()
    b = await api.tenant()
    job_a = await api.job(a)
    job_b = await api.job(b)
    await api.fire()
    wb = await api.key(b, "worker")
    wid_b = await register(api, wb)
    got = await lease(api, wb, wid_b, max=10)
    assert [g["run_id"] for g in got] == [job_b["first_run_id"]]
    # The admin key's worker serves every tenant.
    wid_admin = await register(api, api.admin)
    got = await lease(api, api.admin, wid_admin, max=10)
    assert [g["run_id"] for g in got] == [job_a["first_run_id"]]


async def test_heartbeat_extends_the_lease(api) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(api, t)
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/heartbeat",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["cancel_requested"] is False
    assert parse(body["lease_expires_at"]) >= parse(leased["lease_expires_at"])
    attempt = await api.store.attempts_get(uuid.UUID(leased["attempt_id"]))
    assert attempt.heartbeat_at is not None


async def test_complete(api) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(api, t)
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/complete",
        json={"fencing_token": leased["fencing_token"], "result": {"rows": 3}},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    assert r.json()["attempt_id"] == leased["attempt_id"] and r.json()["ok"] is True
    run = await api.store.runs_get(uuid.UUID(t.id), uuid.UUID(leased["run_id"]))
    assert run.state == "SUCCESS" and run.result == {"rows": 3}
    job = await api.store.jobs_get(uuid.UUID(t.id), uuid.UUID(leased["job_id"]))
    assert job.state == "finished"


async def test_fail_retries_then_fails(api, store: Store) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(
        api,
        t,
        retry={"max_attempts": 3, "initial_delay": 600, "max_delay": 600, "jitter": "none"},
    )
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/fail",
        json={"fencing_token": leased["fencing_token"], "error": "boom"},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(leased["run_id"]))
    assert run.state == "SCHEDULED" and run.last_error == "boom"  # retried after backoff
    assert (run.fire_at - run.due_at).total_seconds() >= 600

    worker2, _, leased2 = await ready_attempt(api, t, name="second")
    r = await api.client.post(
        f"/v1/attempts/{leased2['attempt_id']}/fail",
        json={"fencing_token": leased2["fencing_token"], "error": "bad input", "retryable": False},
        headers=worker2,
    )
    assert r.status_code == 200, r.text
    run2 = await store.runs_get(uuid.UUID(t.id), uuid.UUID(leased2["run_id"]))
    assert run2.state == "FAILED" and run2.last_error == "bad input"
    r = await api.client.post(
        f"/v1/attempts/{leased2['attempt_id']}/fail",
        json={"fencing_token": leased2["fencing_token"]},
        headers=worker2,
    )
    assert r.status_code == 422 and error_of(r)["field"] == "error"


async def test_stale_token_is_409_and_changes_nothing(api, store: Store) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(api, t)
    aid = leased["attempt_id"]
    before = (await api.snapshot(t), await store.attempts_get(uuid.UUID(aid)))
    stale = leased["fencing_token"] - 1
    for action, extra in (
        ("heartbeat", {}),
        ("complete", {"result": 1}),
        ("fail", {"error": "x"}),
        ("release", {}),
    ):
        r = await api.client.post(
            f"/v1/attempts/{aid}/{action}",
            json={"fencing_token": stale, **extra},
            headers=worker,
        )
        assert r.status_code == 409, (action, r.text)
        err = error_of(r)
        assert err["code"] == "stale_fencing_token" and err["field"] == "fencing_token"
    assert (await api.snapshot(t), await store.attempts_get(uuid.UUID(aid))) == before

    # A finished attempt's token is stale too.
    r = await api.client.post(
        f"/v1/attempts/{aid}/complete",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200
    after = await api.snapshot(t)
    r = await api.client.post(
        f"/v1/attempts/{aid}/fail",
        json={"fencing_token": leased["fencing_token"], "error": "late"},
        headers=worker,
    )
    assert r.status_code == 409
    assert await api.snapshot(t) == after


async def test_unknown_and_other_tenants_attempts_are_404(api, store: Store) -> None:
    a = await api.tenant()
    b = await api.tenant()
    _, _, leased = await ready_attempt(api, a)
    wb = await api.key(b, "worker")
    before = (await api.snapshot(a), await store.attempts_get(uuid.UUID(leased["attempt_id"])))
    for aid in (leased["attempt_id"], str(uuid.uuid4()), "bogus"):
        for action, extra in (
            ("heartbeat", {}),
            ("complete", {}),
            ("fail", {"error": "x"}),
            ("release", {}),
        ):
            r = await api.client.post(
                f"/v1/attempts/{aid}/{action}",
                json={"fencing_token": leased["fencing_token"], **extra},
                headers=wb,
            )
            assert r.status_code == 404, (aid, action, r.text)
            assert error_of(r)["code"] == "not_found"
    assert (
        await api.snapshot(a),
        await store.attempts_get(uuid.UUID(leased["attempt_id"])),
    ) == before
    # The admin key reaches every tenant's attempts: unknown ids are still 404, and a
    # known attempt with a wrong token is 409.
    r = await api.client.post(
        f"/v1/attempts/{uuid.uuid4()}/heartbeat", json={"fencing_token": 1}, headers=api.admin
    )
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/heartbeat",
        json={"fencing_token": leased["fencing_token"] + 1},
        headers=api.admin,
    )
    assert r.status_code == 409 and error_of(r)["code"] == "stale_fencing_token"
    r = await api.client.post(
        "/v1/attempts/batch",
        json={"heartbeats": [{"attempt_id": str(uuid.uuid4()), "fencing_token": 1}]},
        headers=api.admin,
    )
    assert [(o["ok"], o["error"]) for o in r.json()["heartbeats"]] == [(False, "not_found")]
    # Workers only: an operator key may not report results.
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/complete",
        json={"fencing_token": leased["fencing_token"]},
        headers=a.headers,
    )
    assert r.status_code == 403


async def test_release_hands_the_run_back(api, store: Store) -> None:
    t = await api.tenant()
    worker, wid, leased = await ready_attempt(api, t)
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/release",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(leased["run_id"]))
    assert run.state == "DISPATCHED"
    [again] = await lease(api, worker, wid, max=1)
    assert again["run_id"] == leased["run_id"]
    assert again["fencing_token"] > leased["fencing_token"]
    assert again["attempt"] == 1  # a released try does not count


async def test_oversize_result_is_413(api, store: Store, settings) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(api, t)
    before = await api.snapshot(t)
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/complete",
        json={"fencing_token": leased["fencing_token"], "result": "x" * settings.max_payload_bytes},
        headers=worker,
    )
    assert r.status_code == 413, r.text
    assert error_of(r)["field"] == "result"
    assert await api.snapshot(t) == before


async def test_batch(api, store: Store) -> None:
    a = await api.tenant()
    b = await api.tenant()
    for i in range(4):
        await api.job(a, name=f"j{i}")
    job_b = await api.job(b, name="other")
    await api.fire()
    worker = await api.key(a, "worker")
    wid = await register(api, worker)
    l1, l2, l3, l4 = await lease(api, worker, wid, max=10)
    admin_wid = await register(api, api.admin)
    [lb] = await lease(api, api.admin, admin_wid, max=10)
    assert lb["run_id"] == job_b["first_run_id"]
    unknown = str(uuid.uuid4())

    r = await api.client.post(
        "/v1/attempts/batch",
        json={
            "heartbeats": [
                {"attempt_id": l1["attempt_id"], "fencing_token": l1["fencing_token"]},
                {"attempt_id": l2["attempt_id"], "fencing_token": l2["fencing_token"] - 1},
                {"attempt_id": lb["attempt_id"], "fencing_token": lb["fencing_token"]},
            ],
            "completions": [
                {
                    "attempt_id": l2["attempt_id"],
                    "fencing_token": l2["fencing_token"],
                    "result": [1, 2],
                },
                {"attempt_id": unknown, "fencing_token": 1},
            ],
            "failures": [
                {
                    "attempt_id": l3["attempt_id"],
                    "fencing_token": l3["fencing_token"],
                    "error": "nope",
                    "retryable": False,
                },
                {
                    "attempt_id": lb["attempt_id"],
                    "fencing_token": lb["fencing_token"],
                    "error": "not yours",
                },
            ],
            "releases": [
                {"attempt_id": l4["attempt_id"], "fencing_token": l4["fencing_token"]},
            ],
        },
        headers=worker,
    )
    assert r.status_code == 200, r.text
    out = r.json()

    def summary(items: list[dict[str, Any]]) -> list[tuple[str, bool, str | None]]:
        return [(i["attempt_id"], i["ok"], i["error"]) for i in items]

    assert summary(out["heartbeats"]) == [
        (l1["attempt_id"], True, None),
        (l2["attempt_id"], False, "stale_fencing_token"),
        (lb["attempt_id"], False, "not_found"),  # another tenant's: untouched
    ]
    assert out["heartbeats"][0]["lease_expires_at"]
    assert summary(out["completions"]) == [
        (l2["attempt_id"], True, None),
        (unknown, False, "not_found"),
    ]
    assert summary(out["failures"]) == [
        (l3["attempt_id"], True, None),
        (lb["attempt_id"], False, "not_found"),
    ]
    assert summary(out["releases"]) == [(l4["attempt_id"], True, None)]

    tid = uuid.UUID(a.id)
    states = {
        key: (await store.runs_get(tid, uuid.UUID(item["run_id"]))).state
        for key, item in (("l1", l1), ("l2", l2), ("l3", l3), ("l4", l4))
    }
    assert states == {"l1": "RUNNING", "l2": "SUCCESS", "l3": "FAILED", "l4": "DISPATCHED"}
    run_b = await store.runs_get(uuid.UUID(b.id), uuid.UUID(lb["run_id"]))
    assert run_b.state == "RUNNING"

    r = await api.client.post("/v1/attempts/batch", json={}, headers=worker)
    assert r.status_code == 200
    assert r.json() == {"heartbeats": [], "completions": [], "failures": [], "releases": []}
    r = await api.client.post(
        "/v1/attempts/batch",
        json={"heartbeats": [{"attempt_id": "x", "fencing_token": 1}]},
        headers=worker,
    )
    assert r.status_code == 422 and error_of(r)["field"] == "heartbeats.0.attempt_id"


async def test_stopping_the_app_answers_waiting_long_polls(api, app) -> None:
    app.state.api.lease_poll_interval = 60.0
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/lease", json={"wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: app.state.api.notifier.waiting == 1)
    await stop_long_polls(app)
    r = await asyncio.wait_for(poll, timeout=5)
    assert r.status_code == 200 and r.json()["attempts"] == []
    # Later long-polls do not wait either.
    r = await asyncio.wait_for(
        api.client.post(f"/v1/workers/{wid}/lease", json={"wait": 10}, headers=worker), 5
    )
    assert r.json()["attempts"] == []


@pytest.mark.parametrize("token", [2**63, -(2**63) - 1, 2**70])
async def test_fencing_token_out_of_range_is_422(api, token: int) -> None:
    """A token outside the 64-bit range is bad input, never a database error."""
    attempt = "01a22bd1-c2ec-7303-a6b7-f56a75710936"
    for path in ("heartbeat", "complete", "fail", "release"):
        body: dict[str, object] = {"fencing_token": token}
        if path == "fail":
            body["error"] = "x"
        r = await api.client.post(f"/v1/attempts/{attempt}/{path}", json=body, headers=api.admin)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "fencing_token"
    r = await api.client.post(
        "/v1/attempts/batch",
        json={"heartbeats": [{"attempt_id": attempt, "fencing_token": token}]},
        headers=api.admin,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "heartbeats.0.fencing_token"


async def test_the_worker_protocol_takes_no_other_tenant(api) -> None:
    # Ignored, the header made the admin key's worker a shared one serving every
    # tenant, and let a tenant's worker key name another tenant to no effect.
    one, two = await api.tenant(), await api.tenant()
    worker = await api.key(one, "worker")
    for headers in (
        {**api.admin, "Cronwheel-Tenant": one.id},
        {**worker, "Cronwheel-Tenant": two.id},
    ):
        r = await api.client.post("/v1/workers", json={"pool": "default"}, headers=headers)
        assert r.status_code == 403, r.text
        assert error_of(r)["field"] == "Cronwheel-Tenant"
    # A worker key naming its own tenant is as without the header.
    wid = await register(api, {**worker, "Cronwheel-Tenant": one.id})
    assert await lease(api, {**worker, "Cronwheel-Tenant": one.id}, wid, max=1) == []
