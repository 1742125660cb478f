"""Every kind of bad job input: each answered with a clear 4xx naming the problem, and
nothing written."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from answers import error_of

from cronwheel.settings import Settings

OVERSIZE = object()  # replaced by a payload just over the configured limit


def iso(value: datetime) -> str:
    return value.isoformat()


# -- bad input: a clear 4xx and nothing written ------------------------------------------

FAR_FUTURE = "2999-01-01T00:00:00Z"


def _bad_bodies() -> list[tuple[str, dict[str, Any], int, str, str | None]]:
    """(case, body, status, code, field)"""
    return [
        (
            "malformed timestamp",
            {"schedule": {"at": "tomorrow at noon"}},
            422,
            "invalid_request",
            "schedule.at",
        ),
        (
            "naive timestamp",
            {"schedule": {"at": "2030-01-01T10:00:00"}},
            422,
            "invalid_request",
            "schedule.at",
        ),
        (
            "beyond the horizon",
            {"schedule": {"at": FAR_FUTURE}},
            422,
            "invalid_schedule",
            "schedule.at",
        ),
        (
            "far in the past",
            {"schedule": {"at": "2001-01-01T00:00:00Z"}},
            422,
            "invalid_schedule",
            "schedule.at",
        ),
        (
            "delay beyond the horizon",
            {"schedule": {"delay": 10 * 366 * 86400}},
            422,
            "invalid_schedule",
            "schedule.delay",
        ),
        ("negative delay", {"schedule": {"delay": -5}}, 422, "invalid_request", "schedule.delay"),
        (
            "two schedule kinds",
            {"schedule": {"delay": 5, "asap": True}},
            422,
            "invalid_request",
            "schedule",
        ),
        ("unknown field", {"colour": "blue"}, 422, "invalid_request", "colour"),
        (
            "unknown schedule field",
            {"schedule": {"asap": True, "when": 1}},
            422,
            "invalid_request",
            "schedule.when",
        ),
        (
            "cron minute out of range",
            {"schedule": {"cron": "61 * * * *"}},
            422,
            "invalid_schedule",
            "schedule.cron",
        ),
        (
            "cron with 7 fields",
            {"schedule": {"cron": "0 0 * * * * *"}},
            422,
            "invalid_schedule",
            "schedule.cron",
        ),
        (
            "unknown cron macro",
            {"schedule": {"cron": "@fortnightly"}},
            422,
            "invalid_schedule",
            "schedule.cron",
        ),
        (
            "cron that never fires",
            {"schedule": {"cron": "0 0 31 2 *"}},
            422,
            "invalid_schedule",
            "schedule.cron",
        ),
        (
            "unknown time zone",
            {"schedule": {"cron": "0 * * * *", "timezone": "Mars/Olympus_Mons"}},
            422,
            "invalid_schedule",
            "schedule.timezone",
        ),
        (
            "unknown ambiguity policy",
            {"schedule": {"cron": "0 * * * *", "on_ambiguous": "both"}},
            422,
            "invalid_request",
            "schedule.on_ambiguous",
        ),
        (
            "unknown overlap policy",
            {"schedule": {"interval": 60, "overlap": "sometimes"}},
            422,
            "invalid_request",
            "schedule.overlap",
        ),
        (
            "zero interval",
            {"schedule": {"interval": 0}},
            422,
            "invalid_request",
            "schedule.interval",
        ),
        (
            "naive interval start",
            {"schedule": {"interval": 60, "start": "2030-01-01T00:00:00"}},
            422,
            "invalid_request",
            "schedule.start",
        ),
        ("no task nor webhook", {"task": None}, 422, "invalid_request", None),
        ("priority out of range", {"priority": 9}, 422, "invalid_request", "priority"),
        ("empty name", {"name": ""}, 422, "invalid_request", "name"),
        ("wrong type", {"tags": "a,b"}, 422, "invalid_request", "tags"),
        (
            "bad webhook url",
            {"task": None, "webhook": {"url": "not a url"}},
            422,
            "invalid_request",
            "webhook.url",
        ),
        ("oversize payload", {"payload": OVERSIZE}, 413, "payload_too_large", "payload"),
    ]


@pytest.mark.parametrize(
    ("case", "fields", "status", "code", "field"),
    _bad_bodies(),
    ids=[c[0] for c in _bad_bodies()],
)
async def test_bad_job_input(
    api,
    settings: Settings,
    case: str,
    fields: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    body: dict[str, Any] = {"name": "bad", "schedule": {"asap": True}, "task": "t"}
    body.update(fields)
    if body.get("payload") is OVERSIZE:
        body["payload"] = {"blob": "x" * settings.max_payload_bytes}
    body = {k: v for k, v in body.items() if v is not None}
    r = await api.client.post("/v1/jobs", json=body, headers=t.headers)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["code"] == code, err
    assert err.get("field") == field, err
    if field is not None and code == "invalid_request":
        assert err["message"].startswith(field + ":"), err
    assert await api.snapshot(t) == before


async def test_malformed_json_and_missing_body(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    r = await api.client.post(
        "/v1/jobs",
        content=b'{"name": "x", "schedule": ',
        headers={**t.headers, "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "invalid_json"
    r = await api.client.post("/v1/jobs", headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r)["code"] == "invalid_request"
    r = await api.client.post("/v1/jobs", json=[1, 2], headers=t.headers)
    assert r.status_code == 422, r.text
    assert await api.snapshot(t) == before


async def test_oversize_request_body_is_413_before_parsing(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    huge = b'{"name": "x", "payload": {"b": "' + b"x" * (2 << 20) + b'"}}'
    r = await api.client.post(
        "/v1/jobs", content=huge, headers={**t.headers, "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert error_of(r)["code"] == "payload_too_large"

    async def chunks():  # no Content-Length: counted as it streams
        for _ in range(40):
            yield b"x" * 65536

    r = await api.client.post(
        "/v1/jobs", content=chunks(), headers={**t.headers, "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert await api.snapshot(t) == before


async def test_bad_idempotency_key(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    r = await api.client.post(
        "/v1/jobs",
        json={"name": "x", "schedule": {"asap": True}, "task": "t"},
        headers={**t.headers, "Idempotency-Key": "k" * 201},
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "Idempotency-Key"
    assert await api.snapshot(t) == before


async def test_what_a_route_would_drop_is_refused(api) -> None:
    # Each of these was taken and then ignored, in part or whole.
    t = await api.tenant()
    job = {"name": "x", "schedule": {"cron": "0 * * * *"}, "task": "t"}
    r = await api.client.post("/v1/jobs", json=job, headers=t.headers)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    before = await api.snapshot(t)
    # A parameter of one value given twice: all but the last would be dropped.
    r = await api.client.delete(f"/v1/jobs/{job_id}?force=false&force=true", headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "force"
    assert error_of(r)["message"] == "force: given more than once; it takes one value"
    # A body sent to a route that takes none (its reason would never be recorded).
    r = await api.client.request(
        "DELETE", f"/v1/jobs/{job_id}", json={"reason": "decommissioned"}, headers=t.headers
    )
    assert r.status_code == 422, r.text
    assert "takes no request body" in error_of(r)["message"]
    # An Idempotency-Key where it makes nothing safe: a batch, a trigger.
    keyed = {**t.headers, "Idempotency-Key": "k-1"}
    r = await api.client.post("/v1/jobs/batch", json={"jobs": [job]}, headers=keyed)
    assert r.status_code == 422 and error_of(r)["field"] == "Idempotency-Key", r.text
    r = await api.client.post(f"/v1/jobs/{job_id}/trigger", headers=keyed)
    assert r.status_code == 422 and error_of(r)["field"] == "Idempotency-Key", r.text
    assert await api.snapshot(t) == before
    # What is fine: a list parameter given twice, and a body that says nothing.
    r = await api.client.get("/v1/runs?state=FAILED&state=SCHEDULED", headers=t.headers)
    assert r.status_code == 200, r.text
    assert {run["state"] for run in r.json()["items"]} == {"SCHEDULED"}
    r = await api.client.request("GET", f"/v1/jobs/{job_id}", content=b"{}", headers=t.headers)
    assert r.status_code == 200, r.text


async def test_a_value_that_would_set_nothing_is_refused(api) -> None:
    t = await api.tenant()
    job = {"name": "x", "schedule": {"cron": "0 * * * *"}, "task": "t", "payload": {"a": 1}}
    r = await api.client.post("/v1/jobs", json=job, headers=t.headers)
    job_id = r.json()["id"]
    worker = await api.key(t, "worker")
    before = await api.snapshot(t)
    # An override whose one change is an empty payload patch changes nothing.
    r = await api.client.post(
        f"/v1/jobs/{job_id}/overrides", json={"scope": "future", "payload": {}}, headers=t.headers
    )
    assert r.status_code == 422, r.text
    assert "the override changes nothing" in error_of(r)["message"]
    # A delay before the next attempt of a failure that has none.
    r = await api.client.post(
        f"/v1/attempts/{uuid.uuid4()}/fail",
        json={"fencing_token": 1, "error": "bad input", "retryable": False, "retry_after": 3600},
        headers=worker,
    )
    assert r.status_code == 422, r.text
    assert "retry_after: a failure that is not retryable" in error_of(r)["message"]
    assert await api.snapshot(t) == before
