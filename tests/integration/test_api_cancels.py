"""The cancels long-poll over HTTP (``POST /v1/workers/{id}/cancels``): what it answers,
that a cancel wakes it, and how it refuses what it must."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from answers import error_of
from test_api_bulk import finished
from test_api_workers import ready_attempt, register

from cronwheel.testing import wait_until_async


async def cancels(api, headers: dict[str, str], worker_id: str, **body: Any) -> list[Any]:
    r = await api.client.post(f"/v1/workers/{worker_id}/cancels", json=body, headers=headers)
    assert r.status_code == 200, r.text
    answered: list[Any] = r.json()["cancels"]
    return answered


async def test_registration_offers_the_cancels_poll(api) -> None:
    t = await api.tenant()
    r = await api.client.post("/v1/workers", json={}, headers=await api.key(t, "worker"))
    assert r.status_code == 200, r.text
    assert r.json()["cancels_poll"] is True


async def test_it_answers_the_running_attempts_asked_to_stop(api) -> None:
    t = await api.tenant()
    worker, wid, leased = await ready_attempt(api, t)
    assert await cancels(api, worker, wid) == []
    r = await api.client.post(f"/v1/runs/{leased['run_id']}/cancel", headers=t.headers)
    assert r.status_code == 200 and r.json()["state"] == "RUNNING", r.text
    told = {
        "attempt_id": leased["attempt_id"],
        "run_id": leased["run_id"],
        "fencing_token": leased["fencing_token"],
    }
    assert await cancels(api, worker, wid) == [told]
    assert await cancels(api, worker, wid) == [told]  # it stays pending: no state here
    # One the worker knows of is left out, and a poll with nothing else waits its wait.
    assert await cancels(api, worker, wid, known=[leased["fencing_token"]], wait=0.1) == []
    # The heartbeat says the same: the two paths agree.
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/heartbeat",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.json()["cancel_requested"] is True
    # Once the attempt has ended, nothing is left to tell.
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/fail",
        json={"fencing_token": leased["fencing_token"], "error": "stopped"},
        headers=worker,
    )
    assert r.json()["run_state"] == "CANCELLED", r.text
    assert await cancels(api, worker, wid) == []


async def test_a_cancel_wakes_the_waiting_poll(api, app) -> None:
    # Woken by the notice of the cancel: the poll waits far longer than the test does.
    t = await api.tenant()
    worker, wid, leased = await ready_attempt(api, t)
    notifier = app.state.api.cancels
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/cancels", json={"wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: notifier.waiting == 1)
    r = await api.client.post(f"/v1/jobs/{leased['job_id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    r = await asyncio.wait_for(poll, timeout=8)
    assert r.status_code == 200, r.text
    assert [c["attempt_id"] for c in r.json()["cancels"]] == [leased["attempt_id"]]
    assert notifier.waiting == 0


async def test_a_bulk_cancel_wakes_the_waiting_poll(api, app) -> None:
    t = await api.tenant()
    worker, wid, leased = await ready_attempt(api, t)
    notifier = app.state.api.cancels
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/cancels", json={"wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: notifier.waiting == 1)
    body = {"selector": {"run_ids": [leased["run_id"]]}}
    r = await api.client.post("/v1/bulk/cancel", json=body, headers=t.headers)
    assert r.status_code == 202, r.text
    location = r.headers["location"]
    r = await asyncio.wait_for(poll, timeout=8)
    assert [c["attempt_id"] for c in r.json()["cancels"]] == [leased["attempt_id"]]
    assert (await finished(api, t.headers, location))["state"] == "done"


async def test_another_workers_cancel_does_not_answer_it(api, app) -> None:
    t = await api.tenant()
    worker, wid, _ = await ready_attempt(api, t)
    other, _, theirs = await ready_attempt(api, t)
    notifier = app.state.api.cancels
    # Long enough to still be waiting once its request has been read, under any load
    # (with 0.5 s, a busy database made the wait run out before it began).
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/cancels", json={"wait": 3}, headers=worker)
    )
    await wait_until_async(lambda: notifier.waiting == 1)
    r = await api.client.post(f"/v1/runs/{theirs['run_id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    r = await asyncio.wait_for(poll, timeout=8)
    assert r.status_code == 200 and r.json()["cancels"] == [], r.text
    del other


async def test_bad_requests_are_refused(api) -> None:
    a = await api.tenant()
    b = await api.tenant()
    wa = await api.key(a, "worker")
    wid = await register(api, wa)
    path = f"/v1/workers/{wid}/cancels"
    r = await api.client.post(path, json={"wait": 11}, headers=wa)  # lease_wait_max is 10
    assert r.status_code == 422 and error_of(r)["field"] == "wait", r.text
    r = await api.client.post(path, json={"known": ["1"]}, headers=wa)
    assert r.status_code == 422 and error_of(r)["field"].startswith("known"), r.text
    r = await api.client.post(path, json={"known": list(range(10_001))}, headers=wa)
    assert r.status_code == 422 and error_of(r)["field"] == "known", r.text
    r = await api.client.post(path, json={"after": 1}, headers=wa)
    assert r.status_code == 422, r.text
    wb = await api.key(b, "worker")
    for other in (wid, str(uuid.uuid4()), "not-an-id"):
        r = await api.client.post(f"/v1/workers/{other}/cancels", json={}, headers=wb)
        assert r.status_code == 404 and error_of(r)["code"] == "not_found", r.text
    r = await api.client.post(path, json={}, headers=a.headers)  # an operator key
    assert r.status_code == 403, r.text


async def test_a_deregistered_worker_is_refused_also_while_it_waits(api, app) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    poll = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/cancels", json={"wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: app.state.api.cancels.waiting == 1)
    r = await api.client.delete(f"/v1/workers/{wid}", headers=worker)
    assert r.status_code == 200, r.text
    r = await asyncio.wait_for(poll, timeout=8)
    assert r.status_code == 410 and error_of(r)["code"] == "worker_deregistered", r.text
    r = await api.client.post(f"/v1/workers/{wid}/cancels", json={}, headers=worker)
    assert r.status_code == 410, r.text


async def test_stopping_the_app_answers_waiting_polls(api, app) -> None:
    from cronwheel.api.app import stop_long_polls

    t = await api.tenant()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    poll: asyncio.Task[httpx.Response] = asyncio.create_task(
        api.client.post(f"/v1/workers/{wid}/cancels", json={"wait": 10}, headers=worker)
    )
    await wait_until_async(lambda: app.state.api.cancels.waiting == 1)
    await stop_long_polls(app)
    r = await asyncio.wait_for(poll, timeout=8)
    assert r.status_code == 200 and r.json()["cancels"] == [], r.text
