"""``/v1/jobs/{id}/overrides`` and ``/v1/runs/{id}/overrides`` on both backends: made,
shown on the run (its payload and ``override_ids``), listed, removed, and every refusal
a JSON 4xx that changed nothing."""

from __future__ import annotations

import uuid
from typing import Any

from answers import error_of

from cronwheel.store import Store

Driver = Any  # the integration conftest's ``api`` fixture
MINUTELY = {"cron": "* * * * *", "timezone": "UTC"}
PAYLOAD = {"region": "eu", "opts": {"depth": 2, "fast": True}}


async def recurring(api: Driver, t: Any) -> dict[str, Any]:
    return await api.job(t, schedule=MINUTELY, payload=PAYLOAD)  # type: ignore[no-any-return]


async def test_a_future_override_shows_on_the_run_and_goes_when_removed(api: Driver) -> None:
    t = await api.tenant()
    job = await recurring(api, t)
    run_id = job["first_run_id"]
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/overrides",
        json={
            "scope": "future",
            "payload": {"region": "us", "opts": {"fast": None}},
            "timeout": 120,
            "priority": 0,
            "reason": "eu outage",
        },
        headers={**t.headers, "X-Request-Id": "req-override-1"},
    )
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["scope"], made["status"], made["run_id"], made["runs"]) == (
        "future",
        "active",
        None,
        [run_id],
    )
    assert (made["timeout"], made["priority"], made["pool"]) == (120.0, 0, None)

    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert run["payload"] == {"region": "us", "opts": {"depth": 2}}
    assert (run["timeout"], run["priority"], run["override_ids"]) == (120.0, 0, [made["id"]])
    # The job's definition is untouched.
    got = (await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)).json()
    assert (got["payload"], got["version"]) == (PAYLOAD, 1)

    listed = (await api.client.get(f"/v1/jobs/{job['id']}/overrides", headers=t.headers)).json()
    assert [o["id"] for o in listed["items"]] == [made["id"]]
    on_run = (await api.client.get(f"/v1/runs/{run_id}/overrides", headers=t.headers)).json()
    assert [o["id"] for o in on_run["items"]] == [made["id"]]

    # A run override on top: the run's own wins; it is removed under the run.
    r = await api.client.post(
        f"/v1/runs/{run_id}/overrides", json={"payload": {"region": "ap"}}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    own = r.json()
    assert (own["scope"], own["run_id"], own["runs"]) == ("run", run_id, [run_id])
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert run["payload"]["region"] == "ap"
    assert run["override_ids"] == [made["id"], own["id"]]
    r = await api.client.delete(f"/v1/runs/{run_id}/overrides/{own['id']}", headers=t.headers)
    assert r.status_code == 200 and r.json()["status"] == "removed"

    r = await api.client.delete(
        f"/v1/jobs/{job['id']}/overrides/{made['id']}",
        params={"reason": "eu is back"},
        headers=t.headers,
    )
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["runs"]) == ("removed", [run_id])
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert (run["payload"], run["timeout"], run["override_ids"]) == (PAYLOAD, 3600.0, [])
    listed = (await api.client.get(f"/v1/jobs/{job['id']}/overrides", headers=t.headers)).json()
    assert listed["items"] == []
    ended = (
        await api.client.get(
            f"/v1/jobs/{job['id']}/overrides", params={"ended": "true"}, headers=t.headers
        )
    ).json()
    assert {o["status"] for o in ended["items"]} == {"removed"}

    # The audit trail says who, why and under which request.
    audit = (
        await api.client.get("/v1/audit", params={"action": "override.add"}, headers=t.headers)
    ).json()
    first = next(a for a in audit["items"] if a["target_id"] == job["id"])
    assert (first["request_id"], first["reason"]) == ("req-override-1", "eu outage")


async def test_next_binds_the_next_occurrence_and_delete_all_removes_every_active_one(
    api: Driver,
) -> None:
    t = await api.tenant()
    job = await recurring(api, t)
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/overrides",
        json={"scope": "next", "pool": "gpu"},
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    assert r.json()["run_id"] == job["first_run_id"]
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/overrides",
        json={"scope": "future", "timeout": 30},
        headers=t.headers,
    )
    assert r.status_code == 201
    r = await api.client.delete(f"/v1/jobs/{job['id']}/overrides", headers=t.headers)
    assert r.status_code == 200
    assert [o["status"] for o in r.json()["items"]] == ["removed", "removed"]
    run = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
    assert (run["pool"], run["timeout"], run["override_ids"]) == ("default", 3600.0, [])


async def test_every_refusal_is_a_json_4xx_and_changes_nothing(api: Driver, store: Store) -> None:
    t = await api.tenant()
    other = await api.tenant()
    job = await recurring(api, t)
    started = await api.job(t, schedule={"asap": True}, payload={"a": 1})
    await api.fire()
    worker = await store.workers_register(
        uuid.UUID(t.id), pool="default", capabilities=[], tags=[], capacity=10, tasks=None
    )
    leased = await store.attempts_lease(worker=worker, max=10)
    assert [a.run_id for a in leased] == [uuid.UUID(started["first_run_id"])]
    viewer = await api.key(t, "viewer")
    before = await api.snapshot(t)
    jobs = f"/v1/jobs/{job['id']}/overrides"
    run = f"/v1/runs/{job['first_run_id']}/overrides"

    cases: list[tuple[str, str, dict[str, str], Any, int, str]] = [
        ("POST", jobs, t.headers, {"scope": "future", "colour": "red"}, 422, "colour"),
        ("POST", jobs, t.headers, {"scope": "future"}, 422, "changes nothing"),
        ("POST", jobs, t.headers, {"scope": "future", "timeout": None}, 422, "null"),
        ("POST", jobs, t.headers, {"scope": "run", "timeout": 5}, 422, "scope"),
        ("POST", jobs, t.headers, {"timeout": 5}, 422, "scope"),
        ("POST", jobs, t.headers, {"scope": "future", "timeout": -1}, 422, "timeout"),
        ("POST", jobs, t.headers, {"scope": "future", "priority": 7}, 422, "priority"),
        ("POST", jobs, t.headers, {"scope": "future", "payload": [1]}, 422, "payload"),
        ("POST", jobs, t.headers, {"scope": "future", "pool": ""}, 422, "pool"),
        (
            "POST",
            jobs,
            t.headers,
            {"scope": "future", "payload": {"x": "y" * 70_000}},
            413,
            "payload",
        ),
        ("POST", jobs, viewer, {"scope": "future", "timeout": 5}, 403, ""),
        ("POST", jobs, other.headers, {"scope": "future", "timeout": 5}, 404, "job"),
        ("POST", run, other.headers, {"timeout": 5}, 404, "run"),
        ("POST", run, t.headers, {"scope": "future", "timeout": 5}, 422, "scope"),
        (
            "POST",
            f"/v1/runs/{started['first_run_id']}/overrides",
            t.headers,
            {"payload": {"a": 2}},
            409,
            "RUNNING",
        ),
        (
            "POST",
            f"/v1/jobs/{started['id']}/overrides",
            t.headers,
            {"scope": "next", "payload": {"a": 2}},
            409,
            "no occurrence",
        ),
        (
            "POST",
            "/v1/jobs/not-an-id/overrides",
            t.headers,
            {"scope": "next", "timeout": 5},
            404,
            "",
        ),
        ("GET", jobs, other.headers, None, 404, "job"),
        ("GET", run, other.headers, None, 404, "run"),
        ("DELETE", f"{jobs}/{uuid.uuid4()}", t.headers, None, 404, "override"),
        ("DELETE", f"{jobs}/not-an-id", t.headers, None, 404, ""),
    ]
    for method, path, headers, body, code, word in cases:
        r = await api.client.request(method, path, json=body, headers=headers)
        assert r.status_code == code, (method, path, body, r.status_code, r.text)
        err = error_of(r)
        assert word.lower() in r.text.lower(), (body, err)
    assert await api.snapshot(t) == before

    # Another tenant cannot remove (or learn of) an override of this one.
    r = await api.client.post(jobs, json={"scope": "future", "timeout": 5}, headers=t.headers)
    made = r.json()
    r = await api.client.delete(f"{jobs}/{made['id']}", headers=other.headers)
    assert r.status_code == 404
    r = await api.client.delete(f"/v1/runs/{job['first_run_id']}/overrides/{made['id']}",
                                headers=t.headers)  # fmt: skip
    assert r.status_code == 404  # a future override is the job's, not bound to the run
    r = await api.client.delete(f"{jobs}/{made['id']}", headers=t.headers)
    assert r.status_code == 200
    r = await api.client.delete(f"{jobs}/{made['id']}", headers=t.headers)
    assert r.status_code == 409 and error_of(r)["code"] == "conflict"


async def test_a_trigger_over_the_limit_with_a_future_override_is_413(
    api: Driver, settings
) -> None:
    """The trigger's payload is checked as the run has it: merged over the job's, then
    under the job's ``future`` overrides, which can make it larger than either."""
    t = await api.tenant()
    job = await recurring(api, t)
    half = settings.max_payload_bytes // 2
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/overrides",
        json={"scope": "future", "payload": {"pad": "x" * half}},
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    before = await api.snapshot(t)
    trigger = f"/v1/jobs/{job['id']}/trigger"
    r = await api.client.post(trigger, json={"payload": {"more": "y" * half}}, headers=t.headers)
    assert r.status_code == 413 and error_of(r)["field"] == "payload", r.text
    assert await api.snapshot(t) == before
    # Within the limit, the run has both.
    r = await api.client.post(trigger, json={"payload": {"more": "y"}}, headers=t.headers)
    assert r.status_code == 201, r.text
    assert r.json()["payload"]["more"] == "y" and len(r.json()["payload"]["pad"]) == half


async def test_an_edit_or_a_removal_that_makes_a_payload_too_large_is_413(
    api: Driver, settings
) -> None:
    """A payload made by the job's overrides is held to the limit however it grows: by
    an edit of the template under a ``future`` override, or by removing an override
    that dropped a key the others leave in."""
    t = await api.tenant()
    third = settings.max_payload_bytes // 3
    job = await api.job(t, schedule=MINUTELY, payload={"a": "x" * third})
    overrides = f"/v1/jobs/{job['id']}/overrides"
    r = await api.client.post(
        overrides, json={"scope": "future", "payload": {"b": "y" * third}}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    before = await api.snapshot(t)
    r = await api.client.patch(
        f"/v1/jobs/{job['id']}",
        json={"payload": {"a": "x" * third, "c": "z" * third}},
        headers=t.headers,
    )
    assert r.status_code == 413 and error_of(r)["field"] == "payload", r.text
    assert await api.snapshot(t) == before
    # An override that drops the template's key keeps a third override within it...
    r = await api.client.post(
        overrides, json={"scope": "future", "payload": {"a": None}}, headers=t.headers
    )
    dropping = r.json()["id"]
    r = await api.client.post(
        overrides, json={"scope": "future", "payload": {"c": "z" * third}}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    before = await api.snapshot(t)
    # ...and removing it alone would bring "a" back beside "b" and "c": refused.
    r = await api.client.delete(f"{overrides}/{dropping}", headers=t.headers)
    assert r.status_code == 413 and error_of(r)["field"] == "payload", r.text
    assert await api.snapshot(t) == before
    # Removing them all leaves the job's own payload.
    r = await api.client.delete(overrides, headers=t.headers)
    assert r.status_code == 200 and len(r.json()["items"]) == 3, r.text


async def test_an_edit_cannot_raise_progress_timeout_above_an_overrides_timeout(
    api: Driver,
) -> None:
    """The bound an override's ``timeout`` is checked against when it is made holds the
    other way round: an edit may not lift ``progress_timeout`` above it while the
    override is still to reach a run (``future``, or bound to an unstarted run)."""
    t = await api.tenant()
    job = await recurring(api, t)
    path = f"/v1/jobs/{job['id']}"
    for scope_path, body in (
        (f"{path}/overrides", {"scope": "future", "timeout": 10}),
        (f"/v1/runs/{job['first_run_id']}/overrides", {"timeout": 10}),
    ):
        r = await api.client.post(scope_path, json=body, headers=t.headers)
        assert r.status_code == 201, r.text
        override_id = r.json()["id"]
        before = await api.snapshot(t)
        r = await api.client.patch(path, json={"progress_timeout": 20}, headers=t.headers)
        assert r.status_code == 422, r.text
        error = error_of(r)
        assert error["field"] == "progress_timeout" and override_id in error["message"]
        assert await api.snapshot(t) == before
        r = await api.client.delete(f"{scope_path}/{override_id}", headers=t.headers)
        assert r.status_code in (200, 204), r.text
    # With no override left in the way, the edit goes through.
    r = await api.client.patch(path, json={"progress_timeout": 20}, headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["progress_timeout"] == 20
