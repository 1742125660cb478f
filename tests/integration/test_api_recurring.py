"""Recurring jobs through the API: pause, resume, trigger, backfill and preview — with
their roles, tenancy and every kind of bad input answered clearly, changing nothing."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from answers import error_of, parse

from cronwheel.api.routers.jobs import preview_items
from cronwheel.domain.spec import MAX_CRON_LENGTH
from cronwheel.store import Store
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.timing import iter_occurrences, local_form, occurrences

D1, D2 = "2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z"
FUTURE = "2999-01-01T00:00:00Z"
HOURLY_NY = {"cron": "0 * * * *", "timezone": "America/New_York"}
CONTROL = ("pause", "resume", "trigger", "backfill")


def _body(action: str) -> dict[str, Any] | None:
    if action == "backfill":
        now = datetime.now(UTC)
        return {"from": (now - timedelta(hours=3)).isoformat(), "to": now.isoformat()}
    return None


# -- pause and resume ----------------------------------------------------------------


async def test_pause_and_resume(api, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY)
    run_id = job["first_run_id"]

    r = await api.client.post(
        f"/v1/jobs/{job['id']}/pause", json={"reason": "maintenance"}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    paused = r.json()
    assert paused["state"] == "paused" and paused["version"] == job["version"] + 1
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert run["state"] == "SCHEDULED" and run["reason"] == "job paused"
    assert parse(run["fire_at"]) == PARKED_FIRE_AT
    assert parse(run["due_at"]) == parse(job["next_due_at"])
    listed = await api.client.get("/v1/jobs", params={"state": "paused"}, headers=t.headers)
    assert [j["id"] for j in listed.json()["items"]] == [job["id"]]

    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/jobs/{job['id']}/pause", headers=t.headers)
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    assert await api.snapshot(t) == before

    r = await api.client.post(f"/v1/jobs/{job['id']}/resume", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "active"
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert run["fire_at"] == run["due_at"] and run["reason"] == "resumed after pause"
    kinds = [e["kind"] for e in run["events"]]
    assert kinds[-2:] == ["run.parked", "run.unparked"]

    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/jobs/{job['id']}/resume", json={}, headers=t.headers)
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    assert await api.snapshot(t) == before


async def test_a_paused_job_is_not_fired(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="asap")  # due now
    r = await api.client.post(f"/v1/jobs/{job['id']}/pause", headers=t.headers)
    assert r.status_code == 200, r.text
    assert await api.fire() == []
    r = await api.client.post(f"/v1/jobs/{job['id']}/resume", headers=t.headers)
    assert [str(f.id) for f in await api.fire()] == [job["first_run_id"]]


# -- trigger -------------------------------------------------------------------------


async def test_trigger_runs_the_job_now(api, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY, payload={"region": "us", "n": 1})
    before = await store.db_now()
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/trigger", json={"payload": {"n": 2}}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["origin"] == "trigger" and run["state"] == "SCHEDULED"
    assert run["job_id"] == job["id"] and run["job_name"] == "hourly"
    assert run["payload"] == {"region": "us", "n": 2}
    due = parse(run["due_at"])
    assert before <= due <= await store.db_now()
    assert run["due_local"] == local_form(due, "America/New_York")
    assert [str(f.id) for f in await api.fire()] == [run["id"]]

    # Without a body: the job's own payload.
    r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=t.headers)
    assert r.status_code == 201 and r.json()["payload"] == {"region": "us", "n": 1}
    listed = await api.client.get("/v1/runs", params={"job_id": job["id"]}, headers=t.headers)
    origins = sorted(x["origin"] for x in listed.json()["items"])
    assert origins == ["schedule", "trigger", "trigger"]


async def test_trigger_refusals(api, settings) -> None:
    t = await api.tenant()
    job = await api.job(t, name="j", schedule=HOURLY_NY, payload={"a": "x" * 3000})
    before = await api.snapshot(t)
    big = {"b": "y" * (settings.max_payload_bytes - 3000)}
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/trigger", json={"payload": big}, headers=t.headers
    )
    assert r.status_code == 413 and error_of(r)["field"] == "payload"
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/trigger", json={"payload": [1]}, headers=t.headers
    )
    assert r.status_code == 422 and error_of(r)["field"] == "payload"
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/trigger", json={"payloads": {}}, headers=t.headers
    )
    assert r.status_code == 422 and error_of(r)["field"] == "payloads"
    assert await api.snapshot(t) == before

    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
    assert r.status_code == 200
    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=t.headers)
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    assert await api.snapshot(t) == before


# -- backfill ------------------------------------------------------------------------


async def test_backfill_is_idempotent(api, store: Store) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY)
    now = await store.db_now()
    start, end = now - timedelta(hours=5), now - timedelta(hours=1)
    body = {"from": start.isoformat(), "to": end.isoformat(), "rate": 100}
    r = await api.client.post(f"/v1/jobs/{job['id']}/backfill", json=body, headers=t.headers)
    assert r.status_code == 202, r.text
    answer = r.json()
    expected = occurrences("0 * * * *", "America/New_York", start, end)
    assert answer["created"] == len(answer["runs"]) == len(expected) == 4
    runs = [
        (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
        for run_id in answer["runs"]
    ]
    assert [parse(x["due_at"]) for x in runs] == expected
    assert {x["origin"] for x in runs} == {"backfill"}
    assert [x["due_local"] for x in runs] == [local_form(d, "America/New_York") for d in expected]

    r = await api.client.post(f"/v1/jobs/{job['id']}/backfill", json=body, headers=t.headers)
    assert r.status_code == 202 and r.json() == {"created": 0, "runs": []}


@pytest.mark.parametrize(
    ("case", "body", "field"),
    [
        ("no body", None, None),
        ("no from", {"to": "2030-01-01T00:00:00Z"}, "from"),
        ("naive from", {"from": "2020-01-01T00:00:00", "to": D2}, "from"),
        ("to before from", {"from": D2, "to": D1}, "to"),
        ("to in the future", {"from": D1, "to": FUTURE}, "to"),
        ("from in the future", {"from": "2998-01-01T00:00:00Z", "to": FUTURE}, "from"),
        ("zero rate", {"from": D1, "to": D2, "rate": 0}, "rate"),
        # Runs are spaced 1/rate apart: this spacing once overflowed into a 500.
        ("the least positive rate", {"from": D1, "to": D2, "rate": 5e-324}, "rate"),
        ("under a run in 1000 s", {"from": D1, "to": D2, "rate": 0.0009}, "rate"),
        ("unknown field", {"from": D1, "to": D2, "x": 1}, "x"),
        ("too many", {"from": "2000-01-01T00:00:00Z", "to": D1}, "to"),
    ],
)
async def test_backfill_refuses_bad_input(
    api, case: str, body: dict[str, Any] | None, field: str | None
) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY)
    before = await api.snapshot(t)
    r = await api.client.post(f"/v1/jobs/{job['id']}/backfill", json=body, headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r).get("field") == field
    assert await api.snapshot(t) == before


async def test_backfill_of_a_one_off_or_cancelled_job(api) -> None:
    t = await api.tenant()
    one_off = await api.job(t, name="once", schedule={"delay": 60})
    before = await api.snapshot(t)
    r = await api.client.post(
        f"/v1/jobs/{one_off['id']}/backfill", json=_body("backfill"), headers=t.headers
    )
    assert r.status_code == 422 and error_of(r)["field"] == "schedule"
    job = await api.job(t, name="every", schedule={"interval": 60})
    await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
    before = await api.snapshot(t)
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/backfill", json=_body("backfill"), headers=t.headers
    )
    assert r.status_code == 409 and error_of(r)["code"] == "illegal_transition"
    assert await api.snapshot(t) == before


# -- preview -------------------------------------------------------------------------


async def test_preview_of_a_cron_job(api, store: Store) -> None:
    t = await api.tenant()
    schedule = {"cron": "30 1 * * *", "timezone": "America/New_York", "on_ambiguous": "all"}
    job = await api.job(t, name="nightly", schedule=schedule)
    before = await store.db_now()
    r = await api.client.get(
        f"/v1/jobs/{job['id']}/preview", params={"count": 5}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    after = await store.db_now()
    assert len(items) == 5
    expected = occurrences("30 1 * * *", "America/New_York", before, after + timedelta(days=7))
    due = [parse(i["due_at"]) for i in items]
    assert due in (expected[:5], expected[1:6])
    for item, instant in zip(items, due, strict=True):
        assert item["due_local"] == local_form(instant, "America/New_York")
        assert item["kind"] in ("normal", "ambiguous-first", "ambiguous-second")

    r = await api.client.get(f"/v1/jobs/{job['id']}/preview", headers=t.headers)
    assert len(r.json()["items"]) == 10  # the default
    for count in (0, 1001, "x"):
        r = await api.client.get(
            f"/v1/jobs/{job['id']}/preview", params={"count": count}, headers=t.headers
        )
        assert r.status_code == 422 and error_of(r)["field"] == "count"


async def test_preview_across_dst_changes(api, store: Store) -> None:
    """The preview is the time engine's: both 01:30s of a fall-back night under
    ``on_ambiguous: all``, and a skipped spring-forward wall time listed with its
    reason under ``on_nonexistent: skip``."""
    t = await api.tenant()
    schedule = {
        "cron": "30 1,2 * * *",
        "timezone": "America/New_York",
        "on_ambiguous": "all",
        "on_nonexistent": "skip",
    }
    made = await api.job(t, name="dst", schedule=schedule)
    job = await store.jobs_get(uuid.UUID(t.id), uuid.UUID(made["id"]))

    fall = preview_items(job, datetime(2030, 11, 3, 4, 0, tzinfo=UTC), 4)
    assert [(i.due_local, i.kind) for i in fall] == [
        ("2030-11-03T01:30:00-04:00", "ambiguous-first"),
        ("2030-11-03T01:30:00-05:00", "ambiguous-second"),
        ("2030-11-03T02:30:00-05:00", "normal"),
        ("2030-11-04T01:30:00-05:00", "normal"),
    ]
    spring = preview_items(job, datetime(2031, 3, 9, 5, 0, tzinfo=UTC), 3)
    assert [i.kind for i in spring] == ["normal", "skipped", "normal"]
    assert spring[1].due_local == "2031-03-09T02:30:00" and "does not exist" in (
        spring[1].reason or ""
    )
    oracle = iter_occurrences(job_schedule(job), spring[0].due_at, include_skipped=True)
    assert [o.utc for o in itertools.islice(oracle, 3)] == [i.due_at for i in spring]


def job_schedule(job: Any) -> Any:
    from cronwheel.api.routers.jobs import schedule_of

    return schedule_of(job)


async def test_preview_of_interval_and_one_off_jobs(api, store: Store) -> None:
    t = await api.tenant()
    every = await api.job(t, name="every", schedule={"interval": 30})
    r = await api.client.get(
        f"/v1/jobs/{every['id']}/preview", params={"count": 3}, headers=t.headers
    )
    items = r.json()["items"]
    due = [parse(i["due_at"]) for i in items]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(due)] == [30, 30]
    assert all(i["due_local"].endswith("+00:00") for i in items)

    at = (await store.db_now() + timedelta(hours=3)).replace(microsecond=0)
    at_local = at.astimezone(datetime.fromisoformat("2030-01-01T00:00:00+05:30").tzinfo)
    once = await api.job(t, name="once", schedule={"at": at_local.isoformat()})
    r = await api.client.get(f"/v1/jobs/{once['id']}/preview", headers=t.headers)
    assert r.json() == {
        "items": [
            {
                "due_at": at.isoformat().replace("+00:00", "Z"),
                "fire_at": at.isoformat().replace("+00:00", "Z"),  # no spread
                "due_local": at_local.isoformat(),
                "kind": "normal",
                "reason": None,
            }
        ]
    }
    await api.client.post(f"/v1/jobs/{once['id']}/cancel", headers=t.headers)
    r = await api.client.get(f"/v1/jobs/{once['id']}/preview", headers=t.headers)
    assert r.status_code == 200 and r.json() == {"items": []}


# -- roles, tenancy, documentation ---------------------------------------------------


async def test_viewers_preview_but_do_not_control(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY)
    viewer = await api.key(t, "viewer")
    worker = await api.key(t, "worker")
    before = await api.snapshot(t)
    for action in CONTROL:
        r = await api.client.post(
            f"/v1/jobs/{job['id']}/{action}", json=_body(action), headers=viewer
        )
        assert r.status_code == 403, (action, r.text)
        assert error_of(r)["code"] == "forbidden"
    r = await api.client.get(f"/v1/jobs/{job['id']}/preview", headers=viewer)
    assert r.status_code == 200 and len(r.json()["items"]) == 10
    r = await api.client.get(f"/v1/jobs/{job['id']}/preview", headers=worker)
    assert r.status_code == 403
    assert await api.snapshot(t) == before


async def test_another_tenants_job_is_not_found(api) -> None:
    owner = await api.tenant()
    other = await api.tenant()
    job = await api.job(owner, name="hourly", schedule=HOURLY_NY)
    before = await api.snapshot(owner)
    for job_id in (job["id"], str(uuid.uuid4()), "not-an-id"):
        for action in CONTROL:
            r = await api.client.post(
                f"/v1/jobs/{job_id}/{action}", json=_body(action), headers=other.headers
            )
            assert r.status_code == 404, (action, r.text)
            assert error_of(r)["code"] == "not_found"
        r = await api.client.get(f"/v1/jobs/{job_id}/preview", headers=other.headers)
        assert r.status_code == 404
    assert await api.snapshot(owner) == before


async def test_the_admin_key_controls_a_named_tenant(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule=HOURLY_NY)
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/pause", headers={**api.admin, "Cronwheel-Tenant": t.id}
    )
    assert r.status_code == 200 and r.json()["state"] == "paused"
    events = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
    assert events["events"][-1]["actor"] == "admin"


async def test_control_endpoints_are_documented(api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    paths = spec["paths"]
    for action, status in (("pause", "200"), ("resume", "200"), ("trigger", "201")):
        op = paths[f"/v1/jobs/{{job_id}}/{action}"]["post"]
        assert status in op["responses"] and "409" in op["responses"], action
        assert op["description"]
    backfill = paths["/v1/jobs/{job_id}/backfill"]["post"]
    assert "202" in backfill["responses"]
    schema = spec["components"]["schemas"]["BackfillRequest"]
    assert {"from", "to"} <= set(schema["properties"]) and set(schema["required"]) == {
        "from",
        "to",
    }
    preview = paths["/v1/jobs/{job_id}/preview"]["get"]
    [count] = [p for p in preview["parameters"] if p["name"] == "count"]
    assert count["schema"]["maximum"] == 1000 and count["schema"]["default"] == 10
    assert "origin" in spec["components"]["schemas"]["RunOut"]["required"]


# -- cron bounds -----------------------------------------------------------------------


async def test_a_cron_out_of_bounds_is_refused_and_nothing_is_written(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    for expr, cron_field, words in [
        (",".join(["1"] * 15_000) + " * * * *", None, ("at most 256 are allowed",)),
        ("*/100000000000000000000 * * * *", "minute", ("minute", "from 1 to 60")),
        ("0 */0 * * *", "hour", ("hour", "step of 0")),
        ("5-1 * * * *", "minute", ("runs backwards", "'5-59,0-1'")),
        ("0 9 * * fri-mon", "day-of-week", ("day-of-week", "'fri-sat,sun-mon'")),
        ("0 0 1 dec-jan *", "month", ("month", "'dec,jan'")),
        (",".join(["0"] * 61) + " 0 * * * *", "second", ("61 list items; at most 60",)),
    ]:
        schedule = {"cron": expr, "timezone": "Europe/Paris"}
        r = await api.client.post(
            "/v1/jobs", json={"name": "c", "schedule": schedule, "task": "t"}, headers=t.headers
        )
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert (err["code"], err["field"]) == ("invalid_schedule", "schedule.cron"), err
        assert err.get("details", {}).get("cron_field") == cron_field, err
        assert all(w in err["message"] for w in words), err
        r = await api.client.post(
            "/v1/jobs/batch",
            json={"jobs": [{"name": "c", "schedule": schedule, "task": "t"}]},
            headers=t.headers,
        )
        assert r.status_code == 422 and error_of(r)["field"] == "jobs.0.schedule.cron", r.text
    assert await api.snapshot(t) == before


async def test_a_step_as_long_as_its_field_is_accepted_and_previewed(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule={"cron": "*/60 */24 * * *"})
    r = await api.client.get(f"/v1/jobs/{job['id']}/preview?count=3", headers=t.headers)
    assert r.status_code == 200, r.text
    instants = [parse(i["due_at"]) for i in r.json()["items"]]
    assert all((u.hour, u.minute) == (0, 0) for u in instants)
    assert [b - a for a, b in itertools.pairwise(instants)] == [timedelta(days=1)] * 2


async def test_the_cron_bounds_are_in_the_openapi_schema(api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    cron = spec["components"]["schemas"]["CronSchedule"]["properties"]["cron"]
    assert cron["maxLength"] == MAX_CRON_LENGTH
    for words in ("At most 256 characters", "a step is 1 to", "does not wrap", "22-23,0-2"):
        assert words in cron["description"], words
