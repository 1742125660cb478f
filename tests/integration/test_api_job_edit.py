"""``PATCH /v1/jobs/{id}`` on both backends: the merge, the version in ``ETag`` and
``If-Match``, every refusal (and that it changed nothing), two edits racing from one
version, and the job's pending run brought in line at once."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from answers import error_of, parse

from cronwheel.store import Store
from cronwheel.timing import local_form

Driver = Any  # the integration conftest's ``api`` fixture
NY = "America/New_York"


async def patch(
    api: Driver,
    job_id: str,
    headers: dict[str, str],
    body: Any,
    *,
    if_match: str | None = None,
    **params: Any,
) -> Any:
    if if_match is not None:
        headers = {**headers, "If-Match": if_match}
    return await api.client.patch(f"/v1/jobs/{job_id}", json=body, headers=headers, params=params)


async def pending_run(store: Store, tenant_id: str, job: dict[str, Any]) -> Any:
    return await store.runs_get(uuid.UUID(tenant_id), uuid.UUID(job["first_run_id"]))


async def test_an_edit_merges_the_fields_given_and_answers_the_new_version(
    api: Driver, store: Store
) -> None:
    t = await api.tenant()
    job = await api.job(
        t, schedule={"delay": 3600}, payload={"a": 1, "b": 2}, tags=["x"], priority=2
    )
    r = await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)
    assert r.headers["etag"] == '"1"'

    r = await patch(
        api,
        job["id"],
        t.headers,
        {"payload": {"a": 9}, "pool": "gpu", "tags": None},
        if_match='"1"',
    )
    assert r.status_code == 200, r.text
    edited = r.json()
    assert r.headers["etag"] == '"2"' and edited["version"] == 2
    # The payload is replaced whole; null sets a field back to its default.
    assert (edited["payload"], edited["pool"], edited["tags"]) == ({"a": 9}, "gpu", [])
    assert (edited["priority"], edited["schedule"], edited["name"]) == (
        2,
        job["schedule"],
        job["name"],
    )
    assert edited["next_due_at"] == job["next_due_at"]
    got = await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)
    assert got.json() == edited and got.headers["etag"] == '"2"'
    run = await pending_run(store, t.id, job)
    assert (run.payload, run.pool, run.tags) == ({"a": 9}, "gpu", [])

    # The bare version works as well as the quoted ETag; no If-Match: the edit applies.
    r = await patch(api, job["id"], t.headers, {"priority": 0}, if_match="2")
    assert r.status_code == 200 and r.json()["version"] == 3
    r = await patch(api, job["id"], t.headers, {"priority": 1})
    assert r.status_code == 200 and r.json()["version"] == 4
    r = await patch(api, job["id"], t.headers, {"priority": 1}, if_match="*")
    # Nothing changes: the job as it is, its version unchanged.
    assert r.status_code == 200 and r.json()["version"] == 4 and r.headers["etag"] == '"4"'


async def test_a_stale_version_is_412_naming_the_current_one(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    await patch(api, job["id"], t.headers, {"payload": {"n": 1}})
    before = await api.snapshot(t)
    for if_match in ('"1"', "1", '"99999999999"'):
        r = await patch(api, job["id"], t.headers, {"payload": {"n": 2}}, if_match=if_match)
        assert r.status_code == 412, r.text
        err = error_of(r)
        assert err["code"] == "precondition_failed" and err["details"] == {"current_version": 2}
        assert "version 2" in err["message"]
        assert r.headers["etag"] == '"2"'
    assert await api.snapshot(t) == before


async def test_two_edits_racing_from_one_version(api: Driver, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    answers = await asyncio.gather(
        *(
            patch(api, job["id"], t.headers, {"payload": {"by": n}}, if_match='"1"')
            for n in range(2)
        )
    )
    assert sorted(r.status_code for r in answers) == [200, 412], [r.text for r in answers]
    [won] = [r.json() for r in answers if r.status_code == 200]
    [lost] = [error_of(r) for r in answers if r.status_code == 412]
    assert lost["details"] == {"current_version": 2}
    final = (await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)).json()
    assert final == won and final["version"] == 2
    assert (await pending_run(store, t.id, job)).payload == won["payload"]


async def test_a_schedule_edit_moves_the_pending_run_at_once(api: Driver, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"cron": "0 0 1 1 *", "timezone": NY})
    before = await store.db_now()
    r = await patch(
        api, job["id"], t.headers, {"schedule": {"cron": "*/5 * * * *", "timezone": NY}}
    )
    assert r.status_code == 200, r.text
    due = parse(r.json()["next_due_at"])
    # From the API's reckoning of the database clock, which may trail it a little.
    assert before - timedelta(seconds=1) <= due <= before + timedelta(minutes=5)
    assert due.minute % 5 == 0 and due.second == 0
    run = await pending_run(store, t.id, job)  # the same run, moved
    assert (run.state.value, run.due_at, run.due_local) == ("SCHEDULED", due, local_form(due, NY))
    r = await api.client.get(f"/v1/runs/{run.id}", headers=t.headers)
    assert r.json()["events"][-1]["kind"] == "run.rescheduled"


async def test_a_paused_job_stays_paused(api: Driver, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    await api.client.post(f"/v1/jobs/{job['id']}/pause", headers=t.headers)
    r = await patch(api, job["id"], t.headers, {"schedule": {"delay": 60}, "payload": {"p": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "paused"
    run = await pending_run(store, t.id, job)
    assert run.reason == "job paused" and run.payload == {"p": 1}
    assert await api.fire() == []  # held


async def test_the_edit_is_recorded_with_its_reason(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600}, priority=2)
    r = await patch(api, job["id"], t.headers, {"priority": 0, "reason": "urgent now"})
    assert r.status_code == 200, r.text
    r = await patch(api, job["id"], t.headers, {"priority": 1}, reason="calmer")
    assert r.status_code == 200, r.text
    r = await api.client.get("/v1/audit", params={"action": "job.edit"}, headers=t.headers)
    second, first = r.json()["items"]
    assert (first["reason"], first["before"], first["after"]) == (
        "urgent now",
        {"priority": 2},
        {"priority": 0},
    )
    assert (second["reason"], second["target_id"]) == ("calmer", job["id"])
    r = await patch(api, job["id"], t.headers, {"priority": 2, "reason": "a"}, reason="b")
    assert r.status_code == 422 and error_of(r)["field"] == "reason"


# -- refusals: a clear 4xx, and nothing changed --------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "field", "words"),
    [
        ({"colour": "red", "size": 3}, 422, "invalid_request", "colour", "unknown field"),
        ({}, 422, "invalid_request", None, "no field"),
        ({"reason": "only a reason"}, 422, "invalid_request", None, "no field"),
        ({"version": 7}, 422, "invalid_request", "version", "unknown field"),
        ({"schedule": {"cron": "0 25 * * *"}}, 422, "invalid_schedule", "schedule.cron", "hour"),
        (
            {"schedule": {"cron": "0 * * * *", "timezone": "Europe/Atlantis"}},
            422,
            "invalid_schedule",
            "schedule.timezone",
            "Europe/Atlantis",
        ),
        ({"schedule": {"interval": 60}}, 422, "invalid_request", "schedule", "one-off"),
        (
            {"schedule": {"at": "2001-01-01T00:00:00Z"}},
            422,
            "invalid_schedule",
            "schedule.at",
            "past",
        ),
        ({"priority": 9}, 422, "invalid_request", "priority", "3"),
        ({"name": None}, 422, "invalid_request", "name", "required"),
        ({"task": None}, 422, "invalid_request", None, "exactly one of 'task' or 'webhook'"),
        ({"progress_timeout": 7200}, 422, "invalid_request", "progress_timeout", "timeout"),
        ({"payload": {"big": "x" * 5000}}, 413, "payload_too_large", "payload", "limit"),
        ([1, 2], 422, "invalid_request", None, "object"),
    ],
)
async def test_bad_patches_are_refused_and_change_nothing(
    api: Driver,
    body: Any,
    status: int,
    code: str,
    field: str | None,
    words: str,
) -> None:
    t = await api.tenant()
    recurring = isinstance(body, dict) and "cron" in body.get("schedule", {})
    job = await api.job(t, schedule={"cron": "0 0 1 1 *"} if recurring else {"delay": 3600})
    before = await api.snapshot(t)
    r = await patch(api, job["id"], t.headers, body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert (err["code"], err.get("field")) == (code, field), err
    assert words in err["message"] or words in str(err.get("details")), err
    assert await api.snapshot(t) == before


async def test_unknown_fields_are_all_named(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t)
    r = await patch(api, job["id"], t.headers, {"colour": "red", "size": 3})
    fields = [e["field"] for e in error_of(r)["details"]["errors"]]
    assert fields == ["colour", "size"]


async def test_a_malformed_if_match_is_422(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    before = await api.snapshot(t)
    for value in ('W/"1"', "one", '"1", "2"', "-1", "1" * 30):
        r = await patch(api, job["id"], t.headers, {"priority": 0}, if_match=value)
        assert r.status_code == 422, (value, r.text)
        assert error_of(r)["field"] == "If-Match"
    assert await api.snapshot(t) == before


async def test_a_job_over_is_409(api: Driver, store: Store) -> None:
    t = await api.tenant()
    cancelled = await api.job(t, schedule={"delay": 600})
    await api.client.post(f"/v1/jobs/{cancelled['id']}/cancel", headers=t.headers)
    dispatched = await api.job(t, schedule={"asap": True})
    await api.fire()
    before = await api.snapshot(t)
    r = await patch(api, cancelled["id"], t.headers, {"priority": 0})
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    assert "cancelled" in error_of(r)["message"]
    # A one-off job's run went out: its schedule stays.
    r = await patch(api, dispatched["id"], t.headers, {"schedule": {"delay": 60}})
    assert r.status_code == 409, r.text
    err = error_of(r)
    assert (err["code"], err["field"]) == ("conflict", "schedule")
    assert err["details"]["run_id"] == dispatched["first_run_id"]
    assert await api.snapshot(t) == before


async def test_another_tenants_job_is_404_and_roles_are_enforced(api: Driver) -> None:
    a, b = await api.tenant(), await api.tenant()
    job = await api.job(a, schedule={"delay": 600})
    viewer, worker = await api.key(a, "viewer"), await api.key(a, "worker")
    before = await api.snapshot(a)
    for path_id in (job["id"], str(uuid.uuid4()), "not-a-uuid"):
        r = await patch(api, path_id, b.headers, {"priority": 0})
        assert r.status_code == 404 and error_of(r)["code"] == "not_found", r.text
    for headers in (viewer, worker):
        r = await patch(api, job["id"], headers, {"priority": 0})
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden", r.text
    assert await api.snapshot(a) == before
    # The admin key edits for the tenant it names.
    r = await patch(api, job["id"], {**api.admin, "Cronwheel-Tenant": a.id}, {"priority": 0})
    assert r.status_code == 200, r.text


async def test_webhook_headers_stay_write_only(api: Driver) -> None:
    t = await api.tenant()
    hook = {"url": "https://example.com/h", "headers": {"Authorization": "Bearer s3cret"}}
    job = await api.job(t, task=None, webhook=hook, schedule={"delay": 600})
    shown = job["webhook"]
    # Sending back what a read shows is refused: the values are not readable.
    r = await patch(api, job["id"], t.headers, {"webhook": shown})
    assert r.status_code == 422 and error_of(r)["field"] == "webhook.headers.Authorization"
    # Other fields leave the webhook, and its real header values, as they are.
    r = await patch(api, job["id"], t.headers, {"payload": {"n": 1}})
    assert r.status_code == 200 and r.json()["webhook"] == shown
    r = await patch(
        api, job["id"], t.headers, {"webhook": {**hook, "url": "https://example.com/new"}}
    )
    assert r.status_code == 200, r.text
    r = await api.client.get("/v1/audit", params={"action": "job.edit"}, headers=t.headers)
    assert "s3cret" not in r.text and "example.com/new" in r.text
