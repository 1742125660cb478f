"""Runs: history, one run with its attempts and events, cancel."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from answers import error_of, parse

from cronwheel.store import Store


async def test_run_detail_shows_timings_attempts_and_events(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="now", tags=["x"], payload={"n": 1})
    run_id = job["first_run_id"]

    r = await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["state"] == "SCHEDULED" and run["job_id"] == job["id"]
    assert run["job_name"] == "now" and run["payload"] == {"n": 1}
    assert run["dispatched_at"] is None and run["dispatch_lateness_ms"] is None
    assert run["attempt"] == 0 and run["max_attempts"] == 3
    assert run["attempts"] == []
    assert [(e["kind"], e["to_state"]) for e in run["events"]] == [("run.transition", "SCHEDULED")]
    parse(run["due_at"])

    await api.fire()
    worker = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={"pool": "default"}, headers=worker)
    wid = r.json()["worker_id"]
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
    [leased] = r.json()["attempts"]
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/complete",
        json={"fencing_token": leased["fencing_token"], "result": {"ok": 1}},
        headers=worker,
    )
    assert r.status_code == 200, r.text

    r = await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)
    run = r.json()
    assert run["state"] == "SUCCESS" and run["result"] == {"ok": 1}
    due = parse(run["due_at"])
    dispatched = parse(run["dispatched_at"])
    started = parse(run["started_at"])
    assert due <= dispatched <= started <= parse(run["finished_at"])
    assert run["dispatch_lateness_ms"] == round((dispatched - due).total_seconds() * 1000, 3)
    assert run["start_lateness_ms"] >= run["dispatch_lateness_ms"] >= 0
    [attempt] = run["attempts"]
    assert attempt["id"] == leased["attempt_id"] and attempt["number"] == 1
    assert attempt["state"] == "SUCCEEDED" and attempt["worker_id"] == wid
    assert attempt["fencing_token"] == leased["fencing_token"]
    transitions = [e["to_state"] for e in run["events"] if e["kind"] == "run.transition"]
    assert transitions == ["SCHEDULED", "DISPATCHED", "RUNNING", "SUCCESS"]
    ids = [e["id"] for e in run["events"]]
    assert ids == sorted(ids)


async def test_list_runs_filters_and_pagination(api, store: Store) -> None:
    t = await api.tenant()
    a = await api.job(t, name="a", tags=["blue"])
    b = await api.job(t, name="b", schedule={"delay": 3600})
    c = await api.job(t, name="c", schedule={"delay": 7200}, tags=["blue"])
    await api.fire()  # a becomes DISPATCHED

    async def ids(**params: Any) -> list[str]:
        r = await api.client.get("/v1/runs", params=params, headers=t.headers)
        assert r.status_code == 200, r.text
        return [run["id"] for run in r.json()["items"]]

    all_runs = [c["first_run_id"], b["first_run_id"], a["first_run_id"]]
    assert await ids() == all_runs  # newest first
    assert await ids(job_id=b["id"]) == [b["first_run_id"]]
    assert await ids(state="DISPATCHED") == [a["first_run_id"]]
    assert await ids(state="SCHEDULED") == [c["first_run_id"], b["first_run_id"]]
    assert sorted(await ids(state=["DISPATCHED", "SCHEDULED"])) == sorted(all_runs)
    assert sorted(await ids(state="dispatched,scheduled")) == sorted(all_runs)
    assert await ids(tag="blue") == [c["first_run_id"], a["first_run_id"]]

    due_b = b["next_due_at"]
    assert await ids(since=due_b) == [c["first_run_id"], b["first_run_id"]]
    assert await ids(until=due_b) == [a["first_run_id"]]
    assert await ids(since=due_b, until=c["next_due_at"]) == [b["first_run_id"]]

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        r = await api.client.get("/v1/runs", params=params, headers=t.headers)
        page = r.json()
        seen += [run["id"] for run in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == all_runs


async def test_bad_run_filters(api) -> None:
    t = await api.tenant()
    await api.job(t)
    for params, field in [
        ({"state": "WAITING"}, "state"),
        ({"state": "SCHEDULED,nope"}, "state"),
        ({"state": ""}, "state"),
        ({"state": "SCHEDULED,"}, "state"),
        ({"since": "2030-01-01T00:00:00"}, "since"),
        ({"until": "yesterday"}, "until"),
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "until"),
        ({"job_id": "not-a-uuid"}, "job_id"),
        ({"limit": 1000}, "limit"),
        ({"cursor": "%%%"}, "cursor"),
    ]:
        r = await api.client.get("/v1/runs", params=params, headers=t.headers)
        assert r.status_code == 422, (params, r.text)
        err = error_of(r)
        assert err["code"] == "invalid_request" and err["field"] == field, (params, err)


async def test_other_tenants_and_malformed_run_ids_are_404(api) -> None:
    a = await api.tenant()
    b = await api.tenant()
    job = await api.job(a, schedule={"delay": 600})
    run_id = job["first_run_id"]
    before = await api.snapshot(a)
    for rid in (run_id, str(uuid.uuid4()), "nope", "0" * 40):
        r = await api.client.get(f"/v1/runs/{rid}", headers=b.headers)
        assert r.status_code == 404, (rid, r.text)
        assert error_of(r)["code"] == "not_found"
        r = await api.client.post(f"/v1/runs/{rid}/cancel", headers=b.headers)
        assert r.status_code == 404, (rid, r.text)
    r = await api.client.get("/v1/runs", params={"job_id": job["id"]}, headers=b.headers)
    assert r.json()["items"] == []
    assert await api.snapshot(a) == before


async def test_cancel_run(api) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    run_id = job["first_run_id"]
    viewer = await api.key(t, "viewer")
    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=viewer)
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    assert await api.snapshot(t) == before

    r = await api.client.post(
        f"/v1/runs/{run_id}/cancel", json={"reason": "wrong day"}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CANCELLED" and r.json()["finished_at"]
    r = await api.client.get(f"/v1/runs/{run_id}", headers=viewer)
    last = r.json()["events"][-1]
    assert last["to_state"] == "CANCELLED" and last["reason"] == "wrong day"
    key_event_actor = last["actor"]
    assert key_event_actor and key_event_actor != "admin"

    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=t.headers)
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    r = await api.client.post(
        f"/v1/runs/{run_id}/cancel", json={"reason": "x", "extra": 1}, headers=t.headers
    )
    assert r.status_code == 422 and error_of(r)["field"] == "extra"
    assert await api.snapshot(t) == before


async def test_cancel_running_run_is_cooperative(api) -> None:
    t = await api.tenant()
    job = await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = (await api.client.post("/v1/workers", json={}, headers=worker)).json()["worker_id"]
    [leased] = (
        await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 5}, headers=worker)
    ).json()["attempts"]
    r = await api.client.post(f"/v1/runs/{job['first_run_id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "RUNNING"  # until the worker stops
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/heartbeat",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200 and r.json()["cancel_requested"] is True


async def test_runs_need_the_right_role(api) -> None:
    t = await api.tenant()
    job = await api.job(t)
    worker = await api.key(t, "worker")
    for path in ("/v1/runs", f"/v1/runs/{job['first_run_id']}"):
        r = await api.client.get(path, headers=worker)
        assert r.status_code == 403, r.text
    r = await api.client.get("/v1/runs", headers={"Authorization": "Bearer cw_wrong"})
    assert r.status_code == 401


async def test_runs_list_time_fields_are_utc(api, store: Store) -> None:
    t = await api.tenant()
    now = await store.db_now()
    at = (now + timedelta(minutes=5)).replace(microsecond=0)
    await api.job(t, schedule={"at": at.astimezone(ZoneInfo("America/New_York")).isoformat()})
    r = await api.client.get("/v1/runs", headers=t.headers)
    [run] = r.json()["items"]
    assert parse(run["due_at"]) == at and parse(run["fire_at"]) == at
    assert parse(run["created_at"]) <= at
