"""``DELETE /v1/workers/{id}`` and long-polls whose client is gone: a run is never left
RUNNING for a worker that cannot receive it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
from answers import error_of
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from cronwheel.api import create_app
from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store import Store
from cronwheel.testing import wait_until_async


async def register(api, headers: dict[str, str]) -> str:
    r = await api.client.post("/v1/workers", json={}, headers=headers)
    assert r.status_code == 200, r.text
    worker_id: str = r.json()["worker_id"]
    return worker_id


async def lease(api, headers: dict[str, str], worker_id: str, **body: Any) -> list[dict[str, Any]]:
    r = await api.client.post(f"/v1/workers/{worker_id}/lease", json=body, headers=headers)
    assert r.status_code == 200, r.text
    attempts: list[dict[str, Any]] = r.json()["attempts"]
    return attempts


async def vanishing_lease(
    app: FastAPI, headers: dict[str, str], worker_id: str, body: dict[str, Any], gone: asyncio.Event
) -> dict[str, Any]:
    """A lease request over raw ASGI from a client that disconnects once ``gone`` is set
    (what a server sees when a worker stops mid-long-poll). Returns the answer the
    server tried to send."""
    request = json.dumps(body).encode()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    path = f"/v1/workers/{worker_id}/lease"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"cronwheel.test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(request)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("cronwheel.test", 80),
    }
    await app(scope, receive, send)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    assert start["status"] == 200, sent
    answer: dict[str, Any] = json.loads(
        b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    )
    return answer


async def test_deregister_releases_what_the_worker_holds(api, store: Store) -> None:
    t = await api.tenant()
    jobs = [await api.job(t, retry={"max_attempts": 1}) for _ in range(2)]
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    held = await lease(api, worker, wid, max=10)
    assert {h["run_id"] for h in held} == {j["first_run_id"] for j in jobs}

    r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
    assert r.status_code == 200, r.text
    assert r.json() == {"worker_id": wid, "released": 2}
    tid = uuid.UUID(t.id)
    for h in held:
        run = await store.runs_get(tid, uuid.UUID(h["run_id"]))
        assert (run.state, run.attempt) == (RunState.DISPATCHED, 0)
        attempt = await store.attempts_get(uuid.UUID(h["attempt_id"]))
        assert attempt.state is AttemptState.RELEASED
        last = (await store.events_list(tid, run_id=run.id, limit=100)).items[-1]
        assert last.reason == "released: worker deregistered"

    # Ready again at once for another worker, as attempt 1 with newer tokens.
    successor = await register(api, worker)
    again = await lease(api, worker, successor, max=10)
    assert {a["run_id"] for a in again} == {h["run_id"] for h in held}
    assert all(a["attempt"] == 1 for a in again)
    assert min(a["fencing_token"] for a in again) > max(h["fencing_token"] for h in held)
    # Deregistering again finds nothing left, and the successor keeps its runs.
    r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
    assert r.status_code == 200 and r.json() == {"worker_id": wid, "released": 0}
    for a in again:
        assert (await store.runs_get(tid, uuid.UUID(a["run_id"]))).state is RunState.RUNNING


async def test_deregister_is_for_the_workers_own_tenant_only(api, store: Store) -> None:
    a = await api.tenant()
    b = await api.tenant()
    await api.job(a)
    await api.fire()
    wa = await api.key(a, "worker")
    wb = await api.key(b, "worker")
    viewer = await api.key(a, "viewer")
    wid = await register(api, wa)
    [held] = await lease(api, wa, wid, max=1)
    before = await api.snapshot(a)

    for other in (wid, str(uuid.uuid4()), "not-an-id"):
        r = await api.client.delete(f"/v1/workers/{other}", headers=wb)
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"
    for headers in (a.headers, viewer):
        r = await api.client.delete(f"/v1/workers/{wid}", headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    r = await api.client.delete(f"/v1/workers/{wid}")
    assert r.status_code == 401
    assert await api.snapshot(a) == before
    attempt = await store.attempts_get(uuid.UUID(held["attempt_id"]))
    assert attempt.state is AttemptState.RUNNING

    # The admin key reaches every tenant's workers.
    r = await api.client.delete(f"/v1/workers/{wid}", headers=api.admin)
    assert r.status_code == 200 and r.json() == {"worker_id": wid, "released": 1}


async def test_a_client_gone_during_the_wait_is_not_leased_to(api, app: FastAPI) -> None:
    # Only a notification wakes the poll, so it leases right after its wait.
    app.state.api.lease_poll_interval = 60.0
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    gone = asyncio.Event()
    poll = asyncio.create_task(vanishing_lease(app, worker, wid, {"max": 1, "wait": 10}, gone))
    await wait_until_async(lambda: app.state.api.notifier.waiting == 1)
    gone.set()  # the worker stops while the server waits
    job = await api.job(t)
    assert len(await api.fire()) == 1  # wakes the poll

    assert (await asyncio.wait_for(poll, timeout=5))["attempts"] == []
    tid, run_id = uuid.UUID(t.id), uuid.UUID(job["first_run_id"])
    assert (await api.store.runs_get(tid, run_id)).state is RunState.DISPATCHED
    assert await api.store.attempts_list(tid, run_id=run_id) == []  # never leased at all
    successor = await register(api, worker)
    [got] = await lease(api, worker, successor, max=1)
    assert got["run_id"] == job["first_run_id"] and got["attempt"] == 1


async def test_a_lease_for_a_client_already_gone_is_released(api, app: FastAPI) -> None:
    t = await api.tenant()
    job = await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    gone = asyncio.Event()
    gone.set()  # the client disconnected right after sending its request

    answer = await vanishing_lease(app, worker, wid, {"max": 1, "wait": 0}, gone)
    assert answer["attempts"] == []
    tid, run_id = uuid.UUID(t.id), uuid.UUID(job["first_run_id"])
    run = await api.store.runs_get(tid, run_id)
    assert (run.state, run.attempt) == (RunState.DISPATCHED, 0)
    [attempt] = await api.store.attempts_list(tid, run_id=run_id)
    assert attempt.state is AttemptState.RELEASED
    [got] = await lease(api, worker, wid, max=1)
    assert got["run_id"] == job["first_run_id"] and got["attempt"] == 1


async def test_deregister_is_documented(api) -> None:
    r = await api.client.get("/openapi.json")
    op = r.json()["paths"]["/v1/workers/{worker_id}"]["delete"]
    assert op["summary"] == "Deregister a worker"
    assert "released" in op["description"] and "404" in op["description"]
    assert op["security"]
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/WorkerDeregistered")
    assert op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse"
    )


# -- a deregistered worker gets nothing any more -----------------------------------------


async def test_a_deregistered_worker_leases_and_starts_nothing(api, store: Store) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
    assert r.status_code == 200, r.text
    job = await api.job(t)
    await api.fire()

    for path, body in (("lease", {"max": 10}), ("start", {"fencing_tokens": [1]})):
        r = await api.client.post(f"/v1/workers/{wid}/{path}", json=body, headers=worker)
        assert r.status_code == 410, r.text
        assert error_of(r)["code"] == "worker_deregistered"
    # The admin key, which reaches every worker, is refused the same way.
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=api.admin)
    assert r.status_code == 410 and error_of(r)["code"] == "worker_deregistered"
    tid, run_id = uuid.UUID(t.id), uuid.UUID(job["first_run_id"])
    assert (await store.runs_get(tid, run_id)).state is RunState.DISPATCHED
    assert await store.attempts_list(tid, run_id=run_id) == []
    # Another tenant still cannot tell the id from an unknown one.
    other = await api.key(await api.tenant(), "worker")
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=other)
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


async def test_every_api_node_refuses_a_worker_deregistered_through_another(
    api, store: Store, settings
) -> None:
    """The node that did not serve the DELETE still has the worker cached as live: the
    store itself refuses the lease."""
    other_node = create_app(settings, store)
    async with (
        LifespanManager(other_node),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=other_node), base_url="http://cronwheel.test"
        ) as node_b,
    ):
        t = await api.tenant()
        worker = await api.key(t, "worker")
        wid = await register(api, worker)
        r = await node_b.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
        assert r.status_code == 200 and r.json()["attempts"] == []  # cached there now
        r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
        assert r.status_code == 200, r.text
        job = await api.job(t)
        await api.fire()

        r = await node_b.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
        assert r.status_code == 410, r.text
        assert error_of(r)["code"] == "worker_deregistered"
        r = await node_b.post(
            f"/v1/workers/{wid}/start", json={"fencing_tokens": [1]}, headers=worker
        )
        assert r.status_code == 410 and error_of(r)["code"] == "worker_deregistered"
        run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
        assert (run.state, run.attempt) == (RunState.DISPATCHED, 0)


async def test_a_long_poll_waiting_when_its_worker_is_deregistered_gets_no_run(
    api, app: FastAPI, store: Store
) -> None:
    # Only a wake-up ends the wait, never the timer.
    app.state.api.lease_poll_interval = 60.0
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1, "wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: app.state.api.notifier.waiting == 1)

    r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
    assert r.status_code == 200, r.text
    job = await api.job(t)
    await api.fire()  # a run the waiting poll would otherwise take

    answer = await asyncio.wait_for(poll, timeout=5)
    assert answer.status_code == 410, answer.text
    assert error_of(answer)["code"] == "worker_deregistered"
    tid, run_id = uuid.UUID(t.id), uuid.UUID(job["first_run_id"])
    assert (await store.runs_get(tid, run_id)).state is RunState.DISPATCHED
    assert await store.attempts_list(tid, run_id=run_id) == []


async def test_the_410_is_documented(api) -> None:
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    for path in ("/v1/workers/{worker_id}/lease", "/v1/workers/{worker_id}/start"):
        op = paths[path]["post"]
        assert "worker_deregistered" in op["description"]
        gone = op["responses"]["410"]
        assert gone["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
