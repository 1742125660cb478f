"""Dead letters redriven in bulk (``POST /v1/dead-letters/redrive``): by ids, by job or
all of them, limited, tenant-scoped; skipped ids reported; bad input changes nothing.
Also through the async client."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from cronwheel import ApiError, AsyncClient
from cronwheel.store import FailItem, Store

URL = "/v1/dead-letters/redrive"


async def _dead_letters(api, store: Store, tenant, runs: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    """Fail the only try of ``runs`` (due now, one try each): dead letters, in id order."""
    await api.fire()
    worker = await store.workers_register(
        uuid.UUID(tenant.id), pool="default", capabilities=[], tags=[], capacity=100
    )
    leased = await store.attempts_lease(worker=worker, max=100)
    assert {str(a.run_id) for a in leased} == set(runs)
    await store.attempts_fail_many(
        items=[FailItem(a.attempt_id, a.fencing_token, "boom") for a in leased]
    )
    for run_id in runs:
        run = await store.runs_get(uuid.UUID(tenant.id), uuid.UUID(run_id))
        assert run.state.value == "DEAD_LETTER"
    return sorted(runs, key=uuid.UUID)


async def _new_dead_letters(api, store: Store, tenant, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    jobs = [
        await api.job(tenant, schedule={"asap": True}, retry={"max_attempts": 1})
        for _ in range(count)
    ]
    return await _dead_letters(api, store, tenant, [j["first_run_id"] for j in jobs])


async def _listed(api, tenant) -> list[str]:  # type: ignore[no-untyped-def]
    r = await api.client.get("/v1/dead-letters", headers=tenant.headers)
    assert r.status_code == 200, r.text
    return sorted((item["id"] for item in r.json()["items"]), key=uuid.UUID)


async def test_by_ids_sends_back_dead_letters_and_reports_the_rest(api, store: Store) -> None:
    t = await api.tenant()
    other = await api.tenant()
    dead = await _new_dead_letters(api, store, t, 3)
    [foreign] = await _new_dead_letters(api, store, other, 1)
    pending = (await api.job(t, schedule={"delay": 3600}))["first_run_id"]
    unknown = str(uuid.uuid4())
    as_admin = {**api.admin, "Cronwheel-Tenant": t.id}
    pending_before = (await api.client.get(f"/v1/runs/{pending}", headers=t.headers)).json()

    r = await api.client.post(
        URL,
        json={"run_ids": [dead[1], pending, unknown, foreign, dead[0]], "reason": "disk swapped"},
        headers=as_admin,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "redriven": 2,
        "run_ids": dead[:2],
        "skipped": [
            {"run_id": pending, "reason": "not a dead letter: SCHEDULED"},
            {"run_id": unknown, "reason": "not found"},
            {"run_id": foreign, "reason": "not found"},
        ],
        "more": False,
    }
    assert await _listed(api, t) == [dead[2]]
    assert await _listed(api, other) == [foreign]
    for run_id in dead[:2]:
        detail = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
        assert (detail["state"], detail["attempt"], detail["max_attempts"]) == ("SCHEDULED", 1, 2)
        last = detail["events"][-1]
        assert (last["from_state"], last["to_state"]) == ("DEAD_LETTER", "SCHEDULED")
        assert (last["actor"], last["reason"]) == ("admin", "disk swapped")
    pending_after = (await api.client.get(f"/v1/runs/{pending}", headers=t.headers)).json()
    assert pending_after == pending_before

    # The redriven runs are due again: the scheduler fires them.
    fired = {str(f.id) for f in await api.fire()}
    assert set(dead[:2]) <= fired


async def test_by_job_and_all_with_a_limit(api, store: Store) -> None:
    t = await api.tenant()
    other = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600}, retry={"max_attempts": 1})
    triggered = []
    for _ in range(2):
        r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=t.headers)
        assert r.status_code == 201, r.text
        triggered.append(r.json()["id"])
    of_job = await _dead_letters(api, store, t, triggered)
    rest = await _new_dead_letters(api, store, t, 3)
    foreign = await _new_dead_letters(api, store, other, 1)

    r = await api.client.post(URL, json={"job_id": job["id"]}, headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json() == {"redriven": 2, "run_ids": of_job, "skipped": [], "more": False}
    assert await _listed(api, t) == rest

    r = await api.client.post(URL, json={"all": True, "limit": 2}, headers=t.headers)
    assert r.status_code == 200, r.text
    assert (r.json()["run_ids"], r.json()["more"]) == (rest[:2], True)
    r = await api.client.post(URL, json={"all": True}, headers=t.headers)
    assert (r.json()["run_ids"], r.json()["more"]) == (rest[2:], False)
    r = await api.client.post(URL, json={"all": True}, headers=t.headers)
    assert r.json() == {"redriven": 0, "run_ids": [], "skipped": [], "more": False}
    assert await _listed(api, other) == foreign


async def test_bad_requests_change_nothing(api, store: Store) -> None:
    t = await api.tenant()
    other = await api.tenant()
    dead = await _new_dead_letters(api, store, t, 1)
    foreign_job = await api.job(other, schedule={"delay": 3600})
    job_id = str(uuid.uuid4())
    before = await api.snapshot(t)

    for body, field in (
        ({}, "run_ids"),
        ({"all": False}, "run_ids"),
        ({"reason": "x"}, "run_ids"),
        ({"run_ids": dead, "job_id": job_id}, "job_id"),
        ({"job_id": job_id, "all": True}, "all"),
        ({"run_ids": dead, "all": True}, "all"),
        ({"run_ids": []}, "run_ids"),
        ({"run_ids": [*dead, "not-an-id"]}, "run_ids.1"),
        ({"run_ids": [str(uuid.uuid4()) for _ in range(1001)]}, "run_ids"),
        ({"job_id": "nope"}, "job_id"),
        ({"all": True, "limit": 0}, "limit"),
        ({"all": True, "limit": 1001}, "limit"),
        ({"all": True, "reason": "x" * 1001}, "reason"),
        ({"all": True, "selector": {}}, "selector"),
    ):
        r = await api.client.post(URL, json=body, headers=t.headers)
        assert r.status_code == 422, (body, r.text)
        error = r.json()["error"]
        assert (error["code"], error["field"]) == ("invalid_request", field), body
        assert field.split(".")[0] in error["message"]

    r = await api.client.post(URL, headers=t.headers)
    assert r.status_code == 422 and "body is required" in r.json()["error"]["message"]
    json_headers = {**t.headers, "Content-Type": "application/json"}
    r = await api.client.post(URL, content=b"{oops", headers=json_headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    for missing in (job_id, foreign_job["id"]):
        r = await api.client.post(URL, json={"job_id": missing}, headers=t.headers)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert missing in r.json()["error"]["message"]

    assert await api.snapshot(t) == before


async def test_roles(api, store: Store) -> None:
    t = await api.tenant()
    dead = await _new_dead_letters(api, store, t, 1)
    keys = {role: await api.key(t, role) for role in ("viewer", "worker")}
    before = await api.snapshot(t)
    for role, headers in keys.items():
        r = await api.client.post(URL, json={"all": True}, headers=headers)
        assert r.status_code == 403, (role, r.text)
    r = await api.client.post(URL, json={"all": True}, headers=api.admin)
    assert r.status_code == 400 and r.json()["error"]["code"] == "tenant_required"
    r = await api.client.post(URL, json={"all": True})
    assert r.status_code == 401
    assert await api.snapshot(t) == before
    # A viewer still reads them.
    r = await api.client.get("/v1/dead-letters", headers=keys["viewer"])
    assert [item["id"] for item in r.json()["items"]] == dead


@pytest.fixture
async def operator(app: FastAPI, api) -> tuple[Any, AsyncClient]:  # type: ignore[no-untyped-def]
    t = await api.tenant()
    client = AsyncClient(
        "http://cronwheel.test", api_key=t.key, transport=httpx.ASGITransport(app=app)
    )
    return t, client


async def test_async_client(api, store: Store, operator) -> None:  # type: ignore[no-untyped-def]
    t, client = operator
    async with client:
        dead = await _new_dead_letters(api, store, t, 3)
        unknown = str(uuid.uuid4())
        out = await client.runs.redrive_many([dead[0], unknown], reason="by ids")
        assert out["run_ids"] == [dead[0]]
        assert out["skipped"] == [{"run_id": unknown, "reason": "not found"}]

        job_id = (await client.runs.get(dead[1]))["job_id"]
        out = await client.runs.redrive_many(job_id=job_id)
        assert (out["redriven"], out["run_ids"]) == (1, [dead[1]])

        out = await client.runs.redrive_many(all=True, limit=1)
        assert (out["run_ids"], out["more"]) == ([dead[2]], False)

        with pytest.raises(ApiError) as caught:
            await client.runs.redrive_many()
        assert (caught.value.status, caught.value.field) == (422, "run_ids")
        with pytest.raises(ApiError) as caught:
            await client.runs.redrive_many([dead[0]], all=True)
        assert (caught.value.status, caught.value.field) == (422, "all")
        for run_id in dead:
            assert (await client.runs.get(run_id))["state"] == "SCHEDULED"
