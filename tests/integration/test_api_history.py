"""The run history over HTTP: filters by pool and tags, every tenant's runs for the
admin key, a run's event timeline paged, attempts with their timings, worker and logs,
tenants kept apart, and bad filters refused."""

from __future__ import annotations

import uuid
from typing import Any

from answers import error_of, parse

from conftest import Driver, TenantInfo


async def _ids(api: Driver, headers: dict[str, str], **params: Any) -> list[str]:
    """Every run the listing selects, walked in pages of 2."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        query = {**params, "limit": 2, **({"cursor": cursor} if cursor else {})}
        r = await api.client.get("/v1/runs", params=query, headers=headers)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [run["id"] for run in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            return seen


async def _runs(api: Driver, t: TenantInfo) -> dict[str, str]:
    """Four jobs of the tenant, due an hour apart, newest last: name to run id."""
    made: dict[str, str] = {}
    for i, (name, pool, tags) in enumerate(
        [
            ("a", "default", ["red"]),
            ("b", "gpu", ["red", "blue"]),
            ("c", "gpu", []),
            ("d", "default", ["blue"]),
        ]
    ):
        job = await api.job(t, name=name, pool=pool, tags=tags, schedule={"delay": 3600 * (i + 1)})
        made[name] = job["first_run_id"]
    return made


async def test_filters_by_pool_and_tags(api: Driver) -> None:
    t = await api.tenant()
    runs = await _runs(api, t)
    assert await _ids(api, t.headers) == [runs["d"], runs["c"], runs["b"], runs["a"]]
    assert await _ids(api, t.headers, pool="gpu") == [runs["c"], runs["b"]]
    assert await _ids(api, t.headers, pool="nope") == []
    assert await _ids(api, t.headers, tag="red") == [runs["b"], runs["a"]]
    assert await _ids(api, t.headers, tag=["red", "blue"]) == [runs["b"]]
    assert await _ids(api, t.headers, tag="blue", pool="default") == [runs["d"]]
    assert await _ids(api, t.headers, tag="blue", state="SCHEDULED,FAILED") == [
        runs["d"],
        runs["b"],
    ]


async def test_the_admin_lists_every_tenants_runs(api: Driver) -> None:
    one, two = await api.tenant(), await api.tenant()
    mine, theirs = await _runs(api, one), await _runs(api, two)
    everything = await _ids(api, api.admin)
    ours = [i for i in everything if i in {*mine.values(), *theirs.values()}]
    # Newest first across the tenants: two's runs were made later, each due later.
    assert ours == [x[n] for n in "dcba" for x in (theirs, mine)]
    assert len(everything) == len(set(everything))
    r = await api.client.get("/v1/runs", params={"limit": 500}, headers=api.admin)
    due = [parse(run["due_at"]) for run in r.json()["items"]]
    assert due == sorted(due, reverse=True)
    assert {run["tenant_id"] for run in r.json()["items"]} >= {one.id, two.id}
    # One tenant's, named by the header.
    named = {**api.admin, "Cronwheel-Tenant": two.id}
    assert await _ids(api, named) == [theirs[n] for n in "dcba"]
    assert await _ids(api, api.admin, pool="gpu", tag="blue") == [theirs["b"], mine["b"]]
    # A viewer of one tenant sees its own only: naming it is no different, naming
    # another is refused (not ignored: its sender meant the other tenant's).
    viewer = await api.key(one, "viewer")
    assert await _ids(api, viewer) == [mine[n] for n in "dcba"]
    assert await _ids(api, {**viewer, "Cronwheel-Tenant": one.id}) == [mine[n] for n in "dcba"]
    r = await api.client.get("/v1/runs", headers={**viewer, "Cronwheel-Tenant": two.id})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["field"] == "Cronwheel-Tenant"


async def test_tenants_never_see_each_others_history(api: Driver) -> None:
    one, two = await api.tenant(), await api.tenant()
    mine = await _runs(api, one)
    await _runs(api, two)
    run_id = mine["b"]
    job_id = (await api.client.get(f"/v1/runs/{run_id}", headers=one.headers)).json()["job_id"]
    assert await _ids(api, two.headers, job_id=job_id) == []
    assert set(await _ids(api, two.headers)).isdisjoint(mine.values())
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
        r = await api.client.get(path, headers=two.headers)
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"


async def test_a_runs_events_paged_oldest_first(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t, name="now")
    run_id = job["first_run_id"]
    await api.fire()
    worker = await api.key(t, "worker")
    r = await api.client.post(
        "/v1/workers", json={"pool": "default", "name": "box-1"}, headers=worker
    )
    wid = r.json()["worker_id"]
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
    [leased] = r.json()["attempts"]
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/fail",
        json={"fencing_token": leased["fencing_token"], "error": "boom", "retryable": False},
        headers=worker,
    )
    assert r.status_code == 200, r.text

    detail = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    [attempt] = detail["attempts"]
    assert attempt["worker_name"] == "box-1" and attempt["worker_id"] == wid
    assert attempt["error"] == "boom" and attempt["state"] == "FAILED"
    assert attempt["leased_at"] == attempt["started_at"]
    span = parse(attempt["finished_at"]) - parse(attempt["started_at"])
    assert attempt["duration_ms"] == round(span.total_seconds() * 1000, 3)
    assert attempt["logs"] == f"/v1/runs/{run_id}/logs?attempt=1"
    r = await api.client.get(attempt["logs"], headers=t.headers)
    assert r.status_code == 200 and r.json()["run_id"] == run_id

    pages: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        r = await api.client.get(f"/v1/runs/{run_id}/events", params=params, headers=t.headers)
        assert r.status_code == 200, r.text
        pages.append(r.json()["items"])
        cursor = r.json()["next_cursor"]
        if not cursor:
            break
    events = [e for page in pages for e in page]
    assert len(pages) >= 2 and all(len(p) <= 2 for p in pages)
    assert [e["id"] for e in events] == [e["id"] for e in detail["events"]]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    transitions = [e["to_state"] for e in events if e["kind"] == "run.transition"]
    assert transitions[:3] == ["SCHEDULED", "DISPATCHED", "RUNNING"]


async def test_bad_history_requests_are_refused(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t)
    run_id = job["first_run_id"]
    worker = await api.key(t, "worker")
    before = await api.snapshot(t)
    for params, field in [
        ({"pool": ""}, "pool"),
        ({"pool": "x" * 101}, "pool"),
        ({"tag": ""}, "tag"),
        ({"tag": [f"t{i}" for i in range(11)]}, "tag"),
        ({"tag": "x" * 101}, "tag"),
        ({"cursor": "garbage"}, "cursor"),
        ({"cursor": str(uuid.uuid4())}, "cursor"),
        ({"limit": 0}, "limit"),
    ]:
        r = await api.client.get("/v1/runs", params=params, headers=t.headers)
        assert r.status_code == 422, (params, r.text)
        assert error_of(r)["field"] == field, (params, r.text)
    for params, field in [({"cursor": "x1"}, "cursor"), ({"limit": 1001}, "limit")]:
        r = await api.client.get(f"/v1/runs/{run_id}/events", params=params, headers=t.headers)
        assert r.status_code == 422, (params, r.text)
        assert error_of(r)["field"] == field, (params, r.text)
    assert (await api.client.get("/v1/runs/nope/events", headers=t.headers)).status_code == 404
    assert (await api.client.get("/v1/runs", headers=worker)).status_code == 403
    assert await api.snapshot(t) == before
