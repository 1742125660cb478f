"""Routing through the worker protocol over HTTP: a worker declaring its ``tasks`` is
leased runs of those tasks only, one declaring none any; a job's ``route_tags`` send its
runs only to workers whose tags include them; what no live worker can take waits with
a reason and an alert; bad input is refused and changes nothing. Both backends."""

from __future__ import annotations

import uuid
from typing import Any

from answers import error_of

from cronwheel.store import Store

ALL_SHARDS = list(range(256))


async def _register(api: Any, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/workers", json=body, headers=headers)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _lease(api: Any, headers: dict[str, str], worker_id: str) -> set[str]:
    r = await api.client.post(f"/v1/workers/{worker_id}/lease", json={"max": 100}, headers=headers)
    assert r.status_code == 200, r.text
    return {a["run_id"] for a in r.json()["attempts"]}


async def _workers_in_store(store: Store) -> int:
    return len((await store.workers_list(None, limit=500)).items)


async def test_a_worker_is_leased_only_its_tasks_and_one_without_tasks_any(
    api: Any, store: Store
) -> None:
    t = await api.tenant()
    key = await api.key(t, "worker")
    build = (await api.job(t, task="reports.build"))["first_run_id"]
    ping = (await api.job(t, task="ops.ping"))["first_run_id"]
    hello = (await api.job(t, task="hello"))["first_run_id"]
    await api.fire()

    reports = await _register(api, key, tasks=["reports.build", "reports.build"])
    assert reports["tasks"] == ["reports.build"]  # echoed as kept: sorted, no repeats
    assert await _lease(api, key, reports["worker_id"]) == {build}

    # Nobody runs hello or ops.ping yet... the reason names the task.
    await store.runs_route_check(shards=ALL_SHARDS, min_wait=0.0, worker_ttl=30.0)
    run = (await api.client.get(f"/v1/runs/{ping}", headers=t.headers)).json()
    reason = "no live worker in pool 'default' handles task 'ops.ping'"
    assert (run["state"], run["wait_reason"]) == ("DISPATCHED", reason)
    alerts = (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"]
    assert sorted(a["message"] for a in alerts) == [
        "1 run waiting: no live worker in pool 'default' handles task 'hello'",
        f"1 run waiting: {reason}",
    ]

    # ...until a worker speaking the protocol without a task list: it takes anything.
    anything = await _register(api, key)
    assert anything["tasks"] is None
    assert await _lease(api, key, anything["worker_id"]) == {ping, hello}
    assert (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"] == []


async def test_route_tags_route_and_show(api: Any, store: Store) -> None:
    t = await api.tenant()
    key = await api.key(t, "worker")
    job = await api.job(t, route_tags=["red"], tags=["billing"])
    assert (job["route_tags"], job["tags"]) == (["red"], ["billing"])
    got = (await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)).json()
    assert got["route_tags"] == ["red"]
    plain = await api.job(t)
    assert plain["route_tags"] == []
    await api.fire()
    run = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
    assert run["route_tags"] == ["red"]

    # Job tags only label: a worker tagged "billing" is no closer to the run.
    billing = await _register(api, key, tags=["billing", "blue"])
    assert await _lease(api, key, billing["worker_id"]) == {plain["first_run_id"]}
    await store.runs_route_check(shards=ALL_SHARDS, min_wait=0.0, worker_ttl=30.0)
    [alert] = (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"]
    assert alert["route_tags"] == ["red"]
    assert alert["message"] == "1 run waiting: no live worker in pool 'default' has tags ['red']"

    red = await _register(api, key, tags=["red", "blue"])
    assert await _lease(api, key, red["worker_id"]) == {job["first_run_id"]}


async def test_bad_tasks_are_refused_and_register_nothing(api: Any, store: Store) -> None:
    t = await api.tenant()
    key = await api.key(t, "worker")
    before = await _workers_in_store(store)
    for body, field in [
        ({"tasks": "reports.build"}, "tasks"),
        ({"tasks": [""]}, "tasks.0"),
        ({"tasks": ["ok", "x" * 201]}, "tasks.1"),
        ({"tasks": ["bad\nname"]}, "tasks.0"),
        ({"tasks": ["nul\x00"]}, "tasks.0"),
        ({"tasks": [7]}, "tasks.0"),
        ({"tasks": [f"t{i}" for i in range(1001)]}, "tasks"),
        ({"tasks": ["t"], "webhooks_only": True}, "tasks"),
    ]:
        r = await api.client.post("/v1/workers", json=body, headers=key)
        assert r.status_code == 422, (body, r.text)
        assert error_of(r)["field"] == field, (body, r.text)
    assert await _workers_in_store(store) == before
    # The bounds: a thousand names of up to 200 characters are fine.
    names = [f"{i:04d}" + "x" * 196 for i in range(1000)]
    assert (await _register(api, key, tasks=names))["tasks"] == names


async def test_bad_route_tags_are_refused_and_change_nothing(api: Any) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    body = {"name": "j", "schedule": {"asap": True}, "task": "t"}
    for route_tags, field in [
        ("red", "route_tags"),
        ([""], "route_tags.0"),
        (["x" * 101], "route_tags.0"),
        (["tab\there"], "route_tags.0"),
        ([1], "route_tags.0"),
        ([f"t{i}" for i in range(51)], "route_tags"),
    ]:
        r = await api.client.post(
            "/v1/jobs", json={**body, "route_tags": route_tags}, headers=t.headers
        )
        assert r.status_code == 422, (route_tags, r.text)
        assert error_of(r)["field"] == field, (route_tags, r.text)
    assert await api.snapshot(t) == before


async def test_listing_workers_is_scoped(api: Any, store: Store) -> None:
    one, two = await api.tenant(), await api.tenant()
    mine = await _register(
        api, await api.key(one, "worker"), pool="gpu", capabilities=["cuda"],
        tags=["red"], tasks=["train"], capacity=4, name="trainer",
    )  # fmt: skip
    theirs = await _register(api, await api.key(two, "worker"))
    shared = await _register(api, api.admin, pool="batch")
    run = await api.job(one, pool="gpu", requires=["cuda"], task="train")
    await api.fire()
    assert await _lease(api, await api.key(one, "worker"), mine["worker_id"]) == {
        run["first_run_id"]
    }

    async def listed(headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
        r = await api.client.get("/v1/workers", params=params, headers=headers)
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"items", "next_cursor"}
        items: list[dict[str, Any]] = r.json()["items"]
        return items

    every = {w["id"] for w in await listed(api.admin)}
    assert {mine["worker_id"], theirs["worker_id"], shared["worker_id"]} <= every
    [trainer] = [w for w in await listed(one.headers) if w["id"] == mine["worker_id"]]
    assert {k: trainer[k] for k in trainer if k not in ("registered_at", "last_seen_at")} == {
        "id": mine["worker_id"],
        "name": "trainer",
        "tenant_id": one.id,
        "pool": "gpu",
        "capabilities": ["cuda"],
        "tasks": ["train"],
        "tags": ["red"],
        "webhooks_only": False,
        "capacity": 4,
        "slots_in_use": 1,
        "running": 1,
        "reserved": 0,
        "live": True,
        "deregistered": False,
        "deregistered_at": None,
    }
    # A tenant sees its own workers and the shared ones, never another tenant's.
    seen = {w["id"] for w in await listed(one.headers)}
    assert {mine["worker_id"], shared["worker_id"]} <= seen
    assert theirs["worker_id"] not in seen
    assert all(w["tenant_id"] in (one.id, None) for w in await listed(one.headers))
    viewer = {w["id"] for w in await listed(await api.key(two, "viewer"))}
    assert theirs["worker_id"] in viewer and mine["worker_id"] not in viewer
    named = {w["id"] for w in await listed({**api.admin, "Cronwheel-Tenant": two.id})}
    assert theirs["worker_id"] in named and mine["worker_id"] not in named
    assert [w["id"] for w in await listed(one.headers, pool="gpu")] == [mine["worker_id"]]

    # Deregistered: still listed, marked, not live.
    r = await api.client.delete(
        f"/v1/workers/{theirs['worker_id']}", headers=await api.key(two, "worker")
    )
    assert r.status_code == 200, r.text
    [gone] = [w for w in await listed(two.headers) if w["id"] == theirs["worker_id"]]
    assert (gone["deregistered"], gone["live"]) == (True, False)

    for headers, status in [
        (await api.key(one, "worker"), 403),
        ({}, 401),
        ({**api.admin, "Cronwheel-Tenant": str(uuid.uuid4())}, 404),
    ]:
        r = await api.client.get("/v1/workers", headers=headers)
        assert r.status_code == status, r.text
        error_of(r)
    for params, field in [({"limit": 0}, "limit"), ({"cursor": "nope"}, "cursor")]:
        r = await api.client.get("/v1/workers", params=params, headers=one.headers)
        assert r.status_code == 422 and error_of(r)["field"] == field, r.text


async def test_listing_workers_pages(api: Any) -> None:
    t = await api.tenant()
    key = await api.key(t, "worker")
    ids = [(await _register(api, key, pool="paged"))["worker_id"] for _ in range(3)]
    r = await api.client.get("/v1/workers?pool=paged&limit=2", headers=t.headers)
    first = r.json()
    assert len(first["items"]) == 2 and first["next_cursor"]
    r = await api.client.get(
        "/v1/workers", params={"pool": "paged", "cursor": first["next_cursor"]}, headers=t.headers
    )
    second = r.json()
    assert second["next_cursor"] is None
    assert [w["id"] for w in first["items"] + second["items"]] == sorted(ids)
