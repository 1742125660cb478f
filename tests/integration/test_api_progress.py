"""A job's ``progress_timeout`` through the API: validated on creation, shown on the job,
its runs and their leases; progress reports (``progress``, ``details``) on the single
and the batched heartbeat, kept on the attempt and shown in ``GET /v1/runs/{id}``."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from test_api_workers import error_of, parse, ready_attempt

from cronwheel.domain.progress import PROGRESS_DETAILS_MAX_BYTES

_BAD: list[tuple[str, dict[str, Any]]] = [
    ("zero", {"progress_timeout": 0}),
    ("negative", {"progress_timeout": -1}),
    ("not a number", {"progress_timeout": "soon"}),
    ("past the timeout", {"timeout": 10, "progress_timeout": 10.5}),
    ("past the default timeout", {"progress_timeout": 3601}),
    (
        "on a webhook job",
        {"task": None, "webhook": {"url": "https://example.com/hook"}, "progress_timeout": 5},
    ),
]


@pytest.mark.parametrize(("case", "fields"), _BAD, ids=[c for c, _ in _BAD])
async def test_a_bad_progress_timeout_is_422_and_creates_nothing(
    api, case: str, fields: dict[str, Any]
) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    body: dict[str, Any] = {"name": "bad", "schedule": {"asap": True}, "task": "t", **fields}
    body = {k: v for k, v in body.items() if v is not None}
    for path, sent in (("/v1/jobs", body), ("/v1/jobs/batch", {"jobs": [body]})):
        r = await api.client.post(path, json=sent, headers=t.headers)
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert err["code"] == "invalid_request", err
        assert err["field"].endswith("progress_timeout"), err
        assert err["message"].startswith(err["field"] + ":"), err
    assert await api.snapshot(t) == before


async def test_the_progress_timeout_shows_on_the_job_its_runs_and_leases(api) -> None:
    t = await api.tenant()
    plain = await api.job(t, name="plain")
    assert plain["progress_timeout"] is None
    job = await api.job(t, name="bounded", timeout=30, progress_timeout=30)  # = timeout: fine
    assert job["progress_timeout"] == 30
    r = await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)
    assert r.json()["progress_timeout"] == 30
    r = await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)
    assert r.json()["progress_timeout"] == 30

    await api.fire()
    worker = await api.key(t, "worker")
    wid = (await api.client.post("/v1/workers", json={}, headers=worker)).json()["worker_id"]
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 10}, headers=worker)
    leased = {a["run_id"]: a for a in r.json()["attempts"]}
    assert leased[job["first_run_id"]]["progress_timeout"] == 30
    assert leased[plain["first_run_id"]]["progress_timeout"] is None
    r = await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)
    [attempt] = r.json()["attempts"]
    assert attempt["progress_at"] is None and attempt["progress_details"] is None
    assert parse(attempt["progress_deadline"]) == parse(attempt["started_at"]) + timedelta(
        seconds=30
    )


async def _attempt_of(api, tenant, run_id: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/runs/{run_id}", headers=tenant.headers)
    assert r.status_code == 200, r.text
    [attempt] = r.json()["attempts"]
    result: dict[str, Any] = attempt
    return result


async def test_the_single_heartbeat_reports_progress(api) -> None:
    t = await api.tenant()
    worker, _, leased = await ready_attempt(api, t, timeout=600, progress_timeout=60)
    url = f"/v1/attempts/{leased['attempt_id']}/heartbeat"
    token = leased["fencing_token"]

    # A plain beat is no progress.
    r = await api.client.post(url, json={"fencing_token": token}, headers=worker)
    assert r.status_code == 200, r.text
    first = await _attempt_of(api, t, leased["run_id"])
    assert first["progress_at"] is None

    # Details imply progress; the deadline moves to the report plus the timeout.
    details = {"rows": 1200, "phase": "copy", "note": "ünïcode"}
    r = await api.client.post(
        url, json={"fencing_token": token, "details": details}, headers=worker
    )
    assert r.status_code == 200, r.text
    attempt = await _attempt_of(api, t, leased["run_id"])
    assert attempt["progress_details"] == details
    reported = parse(attempt["progress_at"])
    assert parse(attempt["progress_deadline"]) == reported + timedelta(seconds=60)
    assert parse(attempt["progress_deadline"]) > parse(first["progress_deadline"])

    # ``progress`` alone reports progress without details: they are replaced.
    r = await api.client.post(url, json={"fencing_token": token, "progress": True}, headers=worker)
    assert r.status_code == 200, r.text
    attempt = await _attempt_of(api, t, leased["run_id"])
    assert attempt["progress_details"] is None
    assert parse(attempt["progress_at"]) >= reported

    # Refused, and nothing changes: details too large, a stale token, an unknown field.
    too_big = {"blob": "x" * PROGRESS_DETAILS_MAX_BYTES}
    r = await api.client.post(
        url, json={"fencing_token": token, "details": too_big}, headers=worker
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "details"
    assert str(PROGRESS_DETAILS_MAX_BYTES) in error_of(r)["message"]
    r = await api.client.post(
        url, json={"fencing_token": token - 1, "details": {"zombie": True}}, headers=worker
    )
    assert r.status_code == 409, r.text
    r = await api.client.post(
        url, json={"fencing_token": token, "detail": {"typo": True}}, headers=worker
    )
    assert (r.status_code, error_of(r)["field"]) == (422, "detail")
    assert await _attempt_of(api, t, leased["run_id"]) == attempt


async def test_batched_heartbeats_report_progress_item_by_item(api) -> None:
    t = await api.tenant()
    worker, wid, first = await ready_attempt(api, t, name="a", progress_timeout=60)
    second_job = await api.job(t, name="b")
    await api.fire()
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 10}, headers=worker)
    [second] = r.json()["attempts"]
    assert second["run_id"] == second_job["first_run_id"]

    def ref(leased: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "attempt_id": leased["attempt_id"],
            "fencing_token": leased["fencing_token"],
            **extra,
        }

    r = await api.client.post(
        "/v1/attempts/batch",
        json={"heartbeats": [ref(first, details=["step", 3]), ref(second)]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    assert [o["ok"] for o in r.json()["heartbeats"]] == [True, True]
    reported = await _attempt_of(api, t, first["run_id"])
    assert reported["progress_details"] == ["step", 3]
    assert reported["progress_at"] is not None
    plain = await _attempt_of(api, t, second["run_id"])
    assert plain["progress_at"] is None and plain["progress_deadline"] is None

    # One oversize item refuses the whole batch, naming it: nothing is applied.
    before = await api.store.attempts_get(uuid.UUID(second["attempt_id"]))
    too_big = "y" * (PROGRESS_DETAILS_MAX_BYTES + 1)
    r = await api.client.post(
        "/v1/attempts/batch",
        json={"heartbeats": [ref(second, progress=True), ref(first, details=too_big)]},
        headers=worker,
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "heartbeats.1.details"
    assert await api.store.attempts_get(uuid.UUID(second["attempt_id"])) == before
    assert await _attempt_of(api, t, first["run_id"]) == reported
