"""Input bounds at the API, on both backends: every value out of bounds is a 4xx JSON
error naming its field, and nothing is written. (Each case once answered 500, or was
stored and broke the scheduler later.)"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cronwheel.domain.bounds import JSON_DEPTH_MAX

pytestmark = pytest.mark.postgres


def _error(r: Any) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert err["code"] and err["message"], err
    return err


async def _post(api: Any, path: str, body: Any, headers: dict[str, str]) -> Any:
    """Post ``body`` as ASCII JSON, as most clients send it (``\\u`` escapes for NUL
    and lone surrogates, which httpx's own encoder cannot write)."""
    return await api.client.post(
        path, content=json.dumps(body), headers={**headers, "Content-Type": "application/json"}
    )


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


_SOON = int(time.time()) + 3600

# (case, fields merged over a valid job, field named by the error)
_BAD_JOBS: list[tuple[str, dict[str, Any], str]] = [
    ("huge delay", {"schedule": {"delay": 1e300}}, "schedule.delay"),
    ("delay past the bound", {"schedule": {"delay": 11 * 366 * 86400}}, "schedule.delay"),
    ("at year 9999 at -23:59", {"schedule": {"at": "9999-12-31T23:59:59-23:59"}}, "schedule.at"),
    ("at year 1 at +23:59", {"schedule": {"at": "0001-01-01T00:00:00+23:59"}}, "schedule.at"),
    ("at before 1970", {"schedule": {"at": "1969-12-31T23:59:59Z"}}, "schedule.at"),
    (
        "interval start year 9999 at -23:59",
        {"schedule": {"interval": 60, "start": "9999-12-31T23:59:59-23:59"}},
        "schedule.start",
    ),
    (
        "interval start year 1 at +23:59",
        {"schedule": {"interval": 60, "start": "0001-01-01T00:00:00+23:59"}},
        "schedule.start",
    ),
    ("sub-second interval", {"schedule": {"interval": 0.001}}, "schedule.interval"),
    ("interval over 10 years", {"schedule": {"interval": 3700 * 86400}}, "schedule.interval"),
    (
        "huge catch-up window",
        {"schedule": {"cron": "0 * * * *", "catch_up_window": 1e300}},
        "schedule.catch_up_window",
    ),
    (
        "huge interval catch-up window",
        {"schedule": {"interval": 60, "catch_up_window": 1e300}},
        "schedule.catch_up_window",
    ),
    (
        "long time zone",
        {"schedule": {"cron": "0 * * * *", "timezone": "x" * 65}},
        "schedule.timezone",
    ),
    ("huge retry delay", {"retry": {"initial_delay": 1e12}}, "retry.initial_delay"),
    ("huge retry cap", {"retry": {"max_delay": 1e12}}, "retry.max_delay"),
    ("timeout past 7 days", {"timeout": 8 * 86400}, "timeout"),
    ("heartbeat timeout past an hour", {"heartbeat_timeout": 3601}, "heartbeat_timeout"),
    ("NUL in the name", {"name": "a\x00b"}, "name"),
    ("control character in the name", {"name": "line\nbreak"}, "name"),
    ("NUL in the task", {"task": "t\x00"}, "task"),
    ("NUL in the pool", {"pool": "p\x00"}, "pool"),
    ("NUL in a tag", {"tags": ["ok", "t\x00"]}, "tags.1"),
    ("tag too long", {"tags": ["t" * 101]}, "tags.0"),
    ("NUL in a requirement", {"requires": ["r\x00"]}, "requires.0"),
    ("NUL in a payload value", {"payload": {"note": "a\x00b"}}, "payload.note"),
    ("NUL in a payload key", {"payload": {"k\x00": 1}}, "payload.k\x00"),
    ("NUL deep in a payload", {"payload": {"a": [{"b": "\x00"}]}}, "payload.a.0.b"),
    ("unpaired surrogate", {"payload": {"s": "\ud800"}}, "payload.s"),
    ("payload nested past the bound", {"payload": _nested(500)}, "payload"),
    (
        "NUL in a webhook header",
        {"task": None, "webhook": {"url": "https://example.com", "headers": {"X": "a\x00"}}},
        "webhook.headers.X",
    ),
    # JSON's types are kept: each of these was once read as another value.
    ("a boolean delay", {"schedule": {"delay": False}}, "schedule.delay"),
    ("a delay as text", {"schedule": {"delay": "60"}}, "schedule.delay"),
    ("asap as a number", {"schedule": {"asap": 1}}, "schedule.asap"),
    # An hour from now, in seconds since 1970: a valid instant if read as one.
    ("an instant as a number", {"schedule": {"at": _SOON}}, "schedule.at"),
    ("an instant as text of a number", {"schedule": {"at": str(_SOON)}}, "schedule.at"),
    ("a boolean priority", {"priority": True}, "priority"),
    ("a priority as text", {"priority": "1"}, "priority"),
    ("max_attempts written as a float", {"retry": {"max_attempts": 2.0}}, "retry.max_attempts"),
    ("a boolean interval", {"schedule": {"interval": True}}, "schedule.interval"),
]


def _job(fields: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "bad", "schedule": {"asap": True}, "task": "t"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize(("case", "fields", "field"), _BAD_JOBS, ids=[c[0] for c in _BAD_JOBS])
async def test_out_of_bounds_job_is_refused_and_nothing_is_written(
    api: Any, case: str, fields: dict[str, Any], field: str
) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    r = await _post(api, "/v1/jobs", _job(fields), t.headers)
    assert r.status_code == 422, r.text
    err = _error(r)
    assert err["field"].startswith(field), err
    assert await api.snapshot(t) == before
    # The same job in a batch names its place in the batch.
    r = await _post(api, "/v1/jobs/batch", {"jobs": [_job({}), _job(fields)]}, t.headers)
    assert r.status_code == 422, r.text
    assert _error(r)["field"].startswith(f"jobs.1.{field}")
    assert await api.snapshot(t) == before


async def test_a_payload_within_the_depth_bound_is_kept_whole(api: Any) -> None:
    t = await api.tenant()
    # The body is level 1 and the payload level 2: the payload may nest the rest.
    payload = _nested(JSON_DEPTH_MAX - 1)
    job = await api.job(t, payload=payload)
    assert job["payload"] == payload
    r = await api.client.post(
        "/v1/jobs", json=_job({"payload": _nested(JSON_DEPTH_MAX)}), headers=t.headers
    )
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
async def test_non_json_numbers_are_refused(api: Any, token: str) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    for body in (
        '{"name": "n", "schedule": {"delay": TOKEN}, "task": "t"}'.replace("TOKEN", token),
        '{"name": "n", "schedule": {"asap": true}, "task": "t", "payload": {"x": TOKEN}}'.replace(
            "TOKEN", token
        ),
    ):
        r = await api.client.post(
            "/v1/jobs",
            content=body,
            headers={**t.headers, "Content-Type": "application/json"},
        )
        assert r.status_code == 400, r.text
        err = _error(r)
        assert err["code"] == "invalid_json"
        assert token.lstrip("-") in err["message"]
    assert await api.snapshot(t) == before


async def test_a_number_too_large_for_a_float_is_refused(api: Any) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    body = '{"name": "n", "schedule": {"asap": true}, "task": "t", "payload": {"x": 1e400}}'
    r = await api.client.post(
        "/v1/jobs", content=body, headers={**t.headers, "Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == "payload.x"
    assert await api.snapshot(t) == before


async def test_a_body_nested_past_pythons_recursion_limit_is_refused(api: Any) -> None:
    t = await api.tenant()
    deep = "[" * 100_000 + "]" * 100_000
    body = '{"name": "n", "schedule": {"asap": true}, "task": "t", "payload": {"x": DEEP}}'
    body = body.replace("DEEP", deep)
    r = await api.client.post(
        "/v1/jobs", content=body, headers={**t.headers, "Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert "nested deeper" in _error(r)["message"]


@pytest.mark.parametrize(
    "body",
    [b"\x80", b'{"name": "\xe6"}', b"\x00\x00\x00[\x00"],
    ids=["lone continuation byte", "truncated sequence", "truncated utf-32"],
)
async def test_a_body_that_is_not_text_is_refused(api: Any, body: bytes) -> None:
    t = await api.tenant()
    job = await api.job(t)
    before = await api.snapshot(t)
    # A required body, and an optional one (its route once answered 500 for these).
    for path in ("/v1/jobs", f"/v1/jobs/{job['id']}/pause"):
        r = await api.client.post(
            path, content=body, headers={**t.headers, "Content-Type": "application/json"}
        )
        assert r.status_code == 400, r.text
        assert _error(r)["code"] == "invalid_json"
    assert await api.snapshot(t) == before


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/jobs", "tag"),
        ("/v1/jobs", "name_prefix"),
        ("/v1/runs", "tag"),
        ("/v1/runs", "state"),
        ("/v1/jobs", "cursor"),
    ],
)
async def test_nul_in_a_list_filter_is_refused(api: Any, path: str, param: str) -> None:
    t = await api.tenant()
    r = await api.client.get(path, params={param: "a\x00b"}, headers=t.headers)
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == param


@pytest.mark.parametrize(
    "instant",
    [
        "0001-01-01T00:00:00+23:59",
        "9999-12-31T23:59:59-23:59",
        "1900-01-01T00:00:00Z",
        "0.5",  # once read as half a second after 1970
    ],
)
async def test_run_filters_at_the_edges_of_time_are_refused(api: Any, instant: str) -> None:
    t = await api.tenant()
    for param in ("since", "until"):
        r = await api.client.get("/v1/runs", params={param: instant}, headers=t.headers)
        assert r.status_code == 422, r.text
        err = _error(r)
        assert err["field"] == param
        assert "1970-01-01T00:00:00Z" in err["message"] or "ISO-8601" in err["message"]


@pytest.mark.parametrize("edge", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
async def test_backfill_at_the_edges_of_time_is_refused(api: Any, edge: str) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"cron": "0 * * * *"})
    before = await api.snapshot(t)
    for body in (
        {"from": edge, "to": "2020-01-01T00:00:00Z"},
        {"from": "2020-01-01T00:00:00Z", "to": edge},
    ):
        r = await api.client.post(f"/v1/jobs/{job['id']}/backfill", json=body, headers=t.headers)
        assert r.status_code == 422, r.text
        assert _error(r)["field"] in ("from", "to")
    assert await api.snapshot(t) == before


async def test_worker_protocol_bounds(api: Any) -> None:
    t = await api.tenant()
    worker_key = await api.key(t, "worker")
    r = await api.client.post(
        "/v1/workers", json={"pool": "p\x00", "capacity": 1}, headers=worker_key
    )
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == "pool"
    r = await api.client.post("/v1/workers", json={"capacity": 1}, headers=worker_key)
    assert r.status_code in (200, 201), r.text
    worker_id = r.json()["worker_id"]
    r = await api.client.post(
        f"/v1/workers/{worker_id}/lease",
        content='{"max": 1, "wait": Infinity}',
        headers={**worker_key, "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    r = await api.client.post(
        f"/v1/workers/{worker_id}/lease", json={"max": 1, "wait": 1e300}, headers=worker_key
    )
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == "wait"
    # A log line stamped at the edge of time: refused before any lookup.
    line = {"ts": "0001-01-01T00:00:00+23:59", "level": "INFO", "message": "m"}
    r = await api.client.post(
        "/v1/attempts/00000000-0000-0000-0000-000000000000/logs",
        json={"fencing_token": 1, "lines": [line]},
        headers=worker_key,
    )
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == "lines.0.ts"
    r = await api.client.post(
        "/v1/attempts/00000000-0000-0000-0000-000000000000/fail",
        content='{"fencing_token": 1, "error": "e", "retry_after": NaN}',
        headers={**worker_key, "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text


async def test_worker_protocol_keeps_json_types(api: Any) -> None:
    """A boolean is not a number, nor a number a boolean, nor text either: each of these
    was once read as another value (0 as false, false as no lead, "7" as token 7)."""
    t = await api.tenant()
    worker_key = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={"webhooks_only": 0}, headers=worker_key)
    assert r.status_code == 422, r.text
    assert _error(r)["field"] == "webhooks_only"
    r = await api.client.post("/v1/workers", json={"capacity": "2"}, headers=worker_key)
    assert r.status_code == 422, r.text
    worker_id = (await api.client.post("/v1/workers", json={}, headers=worker_key)).json()[
        "worker_id"
    ]
    nobody = "00000000-0000-0000-0000-000000000000"
    for path, body, field in (
        (f"/v1/workers/{worker_id}/lease", {"ahead": False}, "ahead"),
        (f"/v1/workers/{worker_id}/lease", {"max": True}, "max"),
        (f"/v1/workers/{worker_id}/start", {"fencing_tokens": ["7"]}, "fencing_tokens.0"),
        (f"/v1/attempts/{nobody}/heartbeat", {"fencing_token": True}, "fencing_token"),
        (f"/v1/attempts/{nobody}/heartbeat", {"fencing_token": 1, "progress": 0}, "progress"),
        (
            "/v1/attempts/batch",
            {"heartbeats": [{"attempt_id": nobody, "fencing_token": 1, "progress": "yes"}]},
            "heartbeats.0.progress",
        ),
        (
            f"/v1/attempts/{nobody}/fail",
            {"fencing_token": 1, "error": "e", "retryable": "no"},
            "retryable",
        ),
        (
            "/v1/attempts/batch",
            {"releases": [{"attempt_id": nobody, "fencing_token": "1"}]},
            "releases.0.fencing_token",
        ),
    ):
        r = await api.client.post(path, json=body, headers=worker_key)
        assert r.status_code == 422, (path, r.text)
        assert _error(r)["field"] == field, (path, r.text)


def test_the_bounds_test_bodies_are_json() -> None:
    """The cases above reach the server as real JSON (json.dumps escapes NUL and lone
    surrogates), so the server, not the client, refuses them."""
    text = json.dumps(_job({"payload": {"s": "\ud800", "n": "\x00"}}))
    assert "\\ud800" in text and "\\u0000" in text
