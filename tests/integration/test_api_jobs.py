"""Jobs: creation for each kind of schedule, idempotency, listing, cancel and batches.
Bad input is in test_api_jobs_bad_input.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from answers import error_of, parse

from cronwheel.api.routers.jobs import BATCH_MAX
from cronwheel.store import Store
from cronwheel.timing import local_form, occurrences

OVERSIZE = object()  # replaced by a payload just over the configured limit


def iso(value: datetime) -> str:
    return value.isoformat()


async def test_create_at_job(api, store: Store) -> None:
    t = await api.tenant()
    now = await store.db_now()
    at = (now + timedelta(hours=2)).replace(microsecond=0)
    at_local = at.astimezone(ZoneInfo("Asia/Kolkata"))
    r = await api.client.post(
        "/v1/jobs",
        json={
            "name": "report",
            "schedule": {"at": iso(at_local)},
            "task": "reports.build",
            "payload": {"region": "eu"},
            "tags": ["reports", "eu"],
            "priority": 1,
            "retry": {"max_attempts": 4},
        },
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "active" and job["name"] == "report"
    assert job["task"] == "reports.build" and job["webhook"] is None
    assert job["payload"] == {"region": "eu"}
    assert job["tags"] == ["reports", "eu"] and job["priority"] == 1
    assert job["retry"]["max_attempts"] == 4 and job["pool"] == "default"
    assert parse(job["next_due_at"]) == at
    assert job["first_run_id"]

    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
    assert run.state == "SCHEDULED" and run.due_at == at
    assert run.due_local == at_local.isoformat()  # the instant as written, with its offset
    assert run.max_attempts == 4


async def test_create_delay_job_is_due_after_the_delay(api, store: Store) -> None:
    t = await api.tenant()
    before = await store.db_now()
    job = await api.job(t, schedule={"delay": 3600})
    after = await store.db_now()
    due = parse(job["next_due_at"])
    assert before + timedelta(seconds=3600) <= due <= after + timedelta(seconds=3600)


async def test_create_asap_job_fires_now(api, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"asap": True})
    fired = await api.fire()
    assert [f.id for f in fired] == [uuid.UUID(job["first_run_id"])]


@pytest.mark.parametrize(
    ("expr", "zone"),
    [
        ("30 1 * * *", "America/New_York"),  # 5 fields
        ("15 */5 * * * *", "Asia/Kolkata"),  # 6: a leading seconds field
        ("@hourly", "Australia/Lord_Howe"),  # a macro
        ("0 9 * JAN-DEC MON-FRI", "Europe/Berlin"),  # names
    ],
)
async def test_create_cron_job(api, store: Store, expr: str, zone: str) -> None:
    t = await api.tenant()
    before = await store.db_now()
    schedule = {"cron": expr, "timezone": zone, "on_ambiguous": "all", "catch_up": "skip"}
    job = await api.job(t, name="cron", schedule=schedule)
    after = await store.db_now()
    assert job["state"] == "active"
    assert job["schedule"]["cron"] == expr and job["schedule"]["timezone"] == zone
    assert job["schedule"]["on_ambiguous"] == "all" and job["schedule"]["catch_up"] == "skip"
    assert job["schedule"]["overlap"] == "allow"  # the default, stored with the job
    due = parse(job["next_due_at"])
    # The first occurrence at or after the moment the job was accepted.
    window = occurrences(expr, zone, before, after + timedelta(days=8), on_ambiguous="all")
    assert due in window[:2] and due >= before

    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
    assert (run.due_at, run.origin) == (due, "schedule")
    assert run.due_local == local_form(due, zone)
    r = await api.client.get(f"/v1/runs/{run.id}", headers=t.headers)
    assert r.json()["origin"] == "schedule" and r.json()["due_local"] == run.due_local


async def test_create_interval_job(api, store: Store) -> None:
    t = await api.tenant()
    start = datetime(2020, 1, 1, 0, 0, 7, tzinfo=UTC)
    job = await api.job(t, schedule={"interval": 90, "start": iso(start)})
    now = await store.db_now()
    due = parse(job["next_due_at"])
    assert (due - start).total_seconds() % 90 == 0
    assert now - timedelta(seconds=91) < due <= now + timedelta(seconds=90)
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
    assert (run.due_at, run.origin, run.due_local) == (due, "schedule", None)


async def test_a_bad_cron_expression_is_named_field_by_field(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    for expr, words in [
        ("0 25 * * *", ("hour", "25")),
        ("0 0 * 13 *", ("month", "13")),
        ("*/0 * * * *", ("minute", "step")),
        ("0 0 * * FUNDAY", ("day-of-week", "FUNDAY")),
        ("0 0 *", ("5 fields",)),
    ]:
        r = await api.client.post(
            "/v1/jobs",
            json={"name": "c", "schedule": {"cron": expr}, "task": "t"},
            headers=t.headers,
        )
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_schedule", "schedule.cron")
        assert all(w in err["message"] for w in words), err
    r = await api.client.post(
        "/v1/jobs",
        json={
            "name": "z",
            "schedule": {"cron": "0 * * * *", "timezone": "Europe/Atlantis"},
            "task": "t",
        },
        headers=t.headers,
    )
    assert r.status_code == 422 and "Europe/Atlantis" in error_of(r)["message"]
    assert error_of(r)["field"] == "schedule.timezone"
    assert await api.snapshot(t) == before


async def test_recurring_jobs_in_a_batch(api, store: Store) -> None:
    t = await api.tenant()
    jobs = [
        {"name": "c", "schedule": {"cron": "*/5 * * * *", "timezone": "Pacific/Chatham"}},
        {"name": "i", "schedule": {"interval": 3600}},
        {"name": "bad", "schedule": {"cron": "* * * * * * *"}},
    ]
    for job in jobs:
        job["task"] = "t"
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
    assert r.status_code == 422 and error_of(r)["field"] == "jobs.2.schedule.cron"
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs[:2]}, headers=t.headers)
    assert r.status_code == 201, r.text
    items = r.json()["items"]
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(items[0]["first_run_id"]))
    assert run.due_local is not None and run.due_local.endswith(("+12:45", "+13:45"))


async def test_create_webhook_job(api) -> None:
    t = await api.tenant()
    r = await api.client.post(
        "/v1/jobs",
        json={
            "name": "hook",
            "schedule": {"delay": 60},
            "webhook": {"url": "https://example.com/hook", "headers": {"X-A": "1"}},
        },
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["task"] is None
    assert job["webhook"]["url"] == "https://example.com/hook"
    assert job["webhook"]["method"] == "POST"


async def test_idempotency_key_replays_the_same_job(api, store: Store) -> None:
    t = await api.tenant()
    body = {"name": "once", "schedule": {"delay": 30}, "task": "t"}
    headers = {**t.headers, "Idempotency-Key": "req-1"}
    first = await api.client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 201, first.text
    again = await api.client.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["first_run_id"] == first.json()["first_run_id"]
    assert again.json()["idempotency_key"] == "req-1"
    jobs = await store.jobs_list(uuid.UUID(t.id))
    assert len(jobs.items) == 1

    # Another tenant may use the same key for its own job.
    other = await api.tenant()
    r = await api.client.post(
        "/v1/jobs", json=body, headers={**other.headers, "Idempotency-Key": "req-1"}
    )
    assert r.status_code == 201 and r.json()["id"] != first.json()["id"]


async def test_idempotency_key_with_another_body_conflicts(api) -> None:
    t = await api.tenant()
    headers = {**t.headers, "Idempotency-Key": "req-2"}
    r = await api.client.post(
        "/v1/jobs", json={"name": "a", "schedule": {"delay": 30}, "task": "t"}, headers=headers
    )
    assert r.status_code == 201
    before = await api.snapshot(t)
    r = await api.client.post(
        "/v1/jobs", json={"name": "b", "schedule": {"delay": 30}, "task": "t"}, headers=headers
    )
    assert r.status_code == 409, r.text
    assert error_of(r)["code"] == "idempotency_conflict"
    assert await api.snapshot(t) == before


async def test_list_jobs_with_cursor_pagination_and_filters(api) -> None:
    t = await api.tenant()
    made = []
    for i in range(5):
        job = await api.job(
            t, name=f"{'etl' if i % 2 else 'bill'}-{i}", tags=["odd" if i % 2 else "even"]
        )
        made.append(job["id"])
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        r = await api.client.get("/v1/jobs", params=params, headers=t.headers)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= 2
        seen += [j["id"] for j in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(made))  # newest first, each exactly once

    r = await api.client.get("/v1/jobs", params={"tag": "odd"}, headers=t.headers)
    assert sorted(j["name"] for j in r.json()["items"]) == ["etl-1", "etl-3"]
    r = await api.client.get("/v1/jobs", params={"name_prefix": "bill"}, headers=t.headers)
    assert sorted(j["name"] for j in r.json()["items"]) == ["bill-0", "bill-2", "bill-4"]
    r = await api.client.get("/v1/jobs", params={"state": "cancelled"}, headers=t.headers)
    assert r.json()["items"] == []

    for params, field in [
        ({"state": "bogus"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"cursor": "garbage"}, "cursor"),
    ]:
        r = await api.client.get("/v1/jobs", params=params, headers=t.headers)
        assert r.status_code == 422, (params, r.text)
        assert error_of(r)["field"] == field


async def test_cancel_job(api, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/cancel", json={"reason": "not needed"}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled"
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
    assert run.state == "CANCELLED"

    # Cancelling again is a conflict and changes nothing.
    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
    assert r.status_code == 409, r.text
    assert error_of(r)["code"] == "illegal_transition"
    assert await api.snapshot(t) == before


async def test_cancel_without_body(api) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled"


async def test_get_job_other_tenant_and_malformed_ids_are_404(api) -> None:
    a = await api.tenant()
    b = await api.tenant()
    job = await api.job(a)
    r = await api.client.get(f"/v1/jobs/{job['id']}", headers=a.headers)
    assert r.status_code == 200 and r.json()["id"] == job["id"]
    before = await api.snapshot(a)
    for path in (
        f"/v1/jobs/{job['id']}",
        f"/v1/jobs/{uuid.uuid4()}",
        "/v1/jobs/not-a-uuid",
        "/v1/jobs/12345",
    ):
        r = await api.client.get(path, headers=b.headers)
        assert r.status_code == 404, (path, r.text)
        assert error_of(r)["code"] == "not_found"
        r = await api.client.post(path + "/cancel", headers=b.headers)
        assert r.status_code == 404, (path, r.text)
    assert await api.snapshot(a) == before
    r = await api.client.get("/v1/jobs", headers=b.headers)
    assert r.json()["items"] == []


async def test_roles_on_jobs(api) -> None:
    t = await api.tenant()
    job = await api.job(t)
    viewer = await api.key(t, "viewer")
    worker = await api.key(t, "worker")
    before = await api.snapshot(t)

    r = await api.client.get(f"/v1/jobs/{job['id']}", headers=viewer)
    assert r.status_code == 200
    r = await api.client.post(
        "/v1/jobs", json={"name": "v", "schedule": {"asap": True}, "task": "t"}, headers=viewer
    )
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=viewer)
    assert r.status_code == 403

    for method, path in (("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{job['id']}")):
        r = await api.client.request(method, path, headers=worker)
        assert r.status_code == 403, r.text
        assert error_of(r)["code"] == "forbidden"
    r = await api.client.post(
        "/v1/jobs", json={"name": "w", "schedule": {"asap": True}, "task": "t"}, headers=worker
    )
    assert r.status_code == 403
    assert await api.snapshot(t) == before


async def test_at_within_the_past_grace_is_accepted_and_due_now(api, store: Store) -> None:
    t = await api.tenant()
    now = await store.db_now()
    at = (now - timedelta(seconds=30)).astimezone(UTC)
    job = await api.job(t, schedule={"at": at.isoformat()})
    assert parse(job["next_due_at"]) == at
    fired = await api.fire()
    assert [str(f.id) for f in fired] == [job["first_run_id"]]


async def test_create_jobs_in_a_batch(api, store: Store) -> None:
    t = await api.tenant()
    now = await store.db_now()
    jobs = [
        {"name": f"b{i}", "schedule": {"at": iso(now + timedelta(minutes=i + 1))}, "task": "t"}
        for i in range(3)
    ]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
    assert r.status_code == 201, r.text
    items = r.json()["items"]
    assert [j["name"] for j in items] == ["b0", "b1", "b2"]
    for i, job in enumerate(items):
        run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
        assert run.due_at == (now + timedelta(minutes=i + 1))


async def test_a_full_batch_is_answered_in_order_and_stored_whole(api, store: Store) -> None:
    # A batch this large is made and stored in parts (one transaction): the answer is
    # the batch's, in the order given, each job as it is read back.
    t = await api.tenant()
    jobs = [
        {"name": f"full-{i:04}", "schedule": {"delay": 60 + i}, "task": "t", "payload": {"n": i}}
        for i in range(BATCH_MAX)
    ]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
    assert r.status_code == 201, r.text
    items = r.json()["items"]
    assert [j["name"] for j in items] == [j["name"] for j in jobs]
    assert [j["payload"] for j in items] == [j["payload"] for j in jobs]
    assert len({j["first_run_id"] for j in items}) == BATCH_MAX
    for job in (items[0], items[500], items[-1]):
        got = await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)
        assert got.json() == {**job, "first_run_id": None}
        run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(job["first_run_id"]))
        assert str(run.job_id) == job["id"]
    listed = await store.runs_list(uuid.UUID(t.id), limit=1000)
    assert len(listed.items) == BATCH_MAX


async def test_a_bad_job_late_in_a_full_batch_writes_nothing(api, store: Store) -> None:
    # The jobs of a full batch are made while the first parts are being written: a job
    # refused near the end (its instant is in the past) undoes the parts already in.
    t = await api.tenant()
    before = await api.snapshot(t)
    now = await store.db_now()
    jobs = [{"name": f"j{i}", "schedule": {"delay": 60}, "task": "t"} for i in range(BATCH_MAX)]
    jobs[900] = {"name": "late", "schedule": {"at": iso(now - timedelta(days=2))}, "task": "t"}
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "jobs.900.schedule.at"
    assert await api.snapshot(t) == before
    # The connection it used is still good: the same batch without the bad job goes in.
    del jobs[900]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
    assert r.status_code == 201, r.text
    assert len((await store.runs_list(uuid.UUID(t.id), limit=1000)).items) == BATCH_MAX - 1


async def test_a_bad_job_in_a_batch_writes_nothing(api, store: Store) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    now = await store.db_now()
    good = {"name": "ok", "schedule": {"delay": 60}, "task": "t"}
    past = {"name": "late", "schedule": {"at": iso(now - timedelta(days=2))}, "task": "t"}
    r = await api.client.post("/v1/jobs/batch", json={"jobs": [good, past]}, headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "jobs.1.schedule.at"
    r = await api.client.post("/v1/jobs/batch", json={"jobs": []}, headers=t.headers)
    assert r.status_code == 422 and error_of(r)["field"] == "jobs"
    r = await api.client.post("/v1/jobs/batch", json={"jobs": [good] * 1001}, headers=t.headers)
    assert r.status_code == 422 and error_of(r)["field"] == "jobs"
    assert await api.snapshot(t) == before
