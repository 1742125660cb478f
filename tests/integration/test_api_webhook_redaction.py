"""Webhook header values are write-only: no answer about a job or a run shows them, to
any key; the store keeps them and the webhook worker's lease answer carries them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from cronwheel.api.redaction import REDACTED
from cronwheel.store import FailItem, Store

SECRET = "Bearer s3cr3t-token-of-the-receiver"
HOOK = {
    "url": "https://example.com/hook",
    "headers": {"Authorization": SECRET, "X-Team": "billing-team-id-77"},
}
SHOWN = {"Authorization": REDACTED, "X-Team": REDACTED}


def hidden(answer: Any) -> None:
    """Neither value appears anywhere in the answer (any field, any depth)."""
    text = json.dumps(answer)
    assert SECRET not in text and "billing-team-id-77" not in text, text


def hook_of(item: dict[str, Any]) -> dict[str, Any]:
    hook: dict[str, Any] = item["webhook"]
    assert hook["url"] == HOOK["url"] and hook["method"] == "POST"
    return hook


async def test_no_read_shows_header_values(api, store: Store) -> None:
    t = await api.tenant()
    viewer = await api.key(t, "viewer")
    body = {"name": "hook", "schedule": {"asap": True}, "webhook": HOOK}
    r = await api.client.post(
        "/v1/jobs", json=body, headers={**t.headers, "Idempotency-Key": "once"}
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert hook_of(created)["headers"] == SHOWN
    hidden(created)
    job_id, run_id = created["id"], created["first_run_id"]

    # The retry with the same key finds the same job, shown the same way.
    again = await api.client.post(
        "/v1/jobs", json=body, headers={**t.headers, "Idempotency-Key": "once"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["id"] == job_id and hook_of(again.json())["headers"] == SHOWN
    # A different request under the same key is still told apart.
    changed = {**body, "webhook": {**HOOK, "headers": {"Authorization": "Bearer other"}}}
    r = await api.client.post(
        "/v1/jobs", json=changed, headers={**t.headers, "Idempotency-Key": "once"}
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_conflict"

    await api.fire()
    reads = [
        f"/v1/jobs/{job_id}",
        "/v1/jobs",
        f"/v1/runs/{run_id}",
        "/v1/runs",
        f"/v1/runs?job_id={job_id}",
    ]
    for headers in (t.headers, viewer, {**api.admin, "Cronwheel-Tenant": t.id}):
        for path in reads:
            r = await api.client.get(path, headers=headers)
            assert r.status_code == 200, (path, r.text)
            answer = r.json()
            items = answer.get("items", [answer])
            [item] = [i for i in items if i.get("webhook")]
            assert hook_of(item)["headers"] == SHOWN, path
            hidden(answer)
    r = await api.client.post(f"/v1/jobs/{job_id}/trigger", json={}, headers=t.headers)
    assert r.status_code in (200, 201), r.text
    assert hook_of(r.json())["headers"] == SHOWN
    hidden(r.json())

    # Kept as given for the call itself.
    job = await store.jobs_get(uuid.UUID(t.id), uuid.UUID(job_id))
    assert job.template.webhook is not None
    assert job.template.webhook["headers"] == HOOK["headers"]
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(run_id))
    assert run.webhook is not None and run.webhook["headers"] == HOOK["headers"]


async def test_the_webhook_workers_lease_carries_the_values(api) -> None:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    job = await api.job(t, task=None, webhook=HOOK)
    await api.fire()
    r = await api.client.post(
        "/v1/workers", json={"capabilities": ["webhook"], "webhooks_only": True}, headers=worker
    )
    assert r.status_code == 200, r.text
    wid = r.json()["worker_id"]
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
    assert r.status_code == 200, r.text
    [leased] = r.json()["attempts"]
    assert leased["run_id"] == job["first_run_id"]
    assert leased["webhook"]["headers"] == HOOK["headers"]
    # ... and the run read at the same time does not.
    r = await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)
    assert hook_of(r.json())["headers"] == SHOWN
    hidden(r.json())


async def test_dead_letters_and_batch_answers_hide_them_too(api, store: Store) -> None:
    t = await api.tenant()
    r = await api.client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {
                    "name": "a",
                    "schedule": {"asap": True},
                    "webhook": HOOK,
                    "retry": {"max_attempts": 1},
                },
                {"name": "b", "schedule": {"asap": True}, "task": "t.run"},
            ]
        },
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    hook_job, task_job = r.json()["items"]
    assert hook_of(hook_job)["headers"] == SHOWN and task_job["webhook"] is None
    hidden(r.json())

    await api.fire()
    worker = await store.workers_register(
        uuid.UUID(t.id), pool="default", capabilities=["webhook"], tags=[], capacity=1
    )
    [attempt] = await store.attempts_lease(worker=worker, max=1, webhooks_only=True)
    assert attempt.webhook is not None and attempt.webhook["headers"] == HOOK["headers"]
    await store.attempts_fail_many(items=[FailItem(attempt.attempt_id, attempt.fencing_token, "x")])
    run = await store.runs_get(uuid.UUID(t.id), attempt.run_id)
    assert run.state.value == "DEAD_LETTER"
    r = await api.client.get("/v1/dead-letters", headers=t.headers)
    assert r.status_code == 200, r.text
    [dead] = r.json()["items"]
    assert dead["id"] == hook_job["first_run_id"]
    assert hook_of(dead)["headers"] == SHOWN
    hidden(r.json())


async def test_the_marker_is_not_a_value_to_send(api) -> None:
    t = await api.tenant()
    hook = {"url": "https://example.com/hook", "headers": {"Authorization": REDACTED}}
    r = await api.client.post(
        "/v1/jobs",
        json={"name": "copy", "schedule": {"asap": True}, "webhook": hook},
        headers=t.headers,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "webhook.headers.Authorization"
    r = await api.client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {"name": "ok", "schedule": {"asap": True}, "task": "t.run"},
                {"name": "copy", "schedule": {"asap": True}, "webhook": hook},
            ]
        },
        headers=t.headers,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "jobs.1.webhook.headers.Authorization"
    assert (await api.client.get("/v1/jobs", headers=t.headers)).json()["items"] == []


async def test_the_redaction_is_documented(api) -> None:
    schemas = (await api.client.get("/openapi.json")).json()["components"]["schemas"]
    for name in ("JobOut", "RunOut"):
        description = schemas[name]["properties"]["webhook"]["description"]
        assert REDACTED in description and "write-only" in description
    leased = schemas["LeasedAttemptOut"]["properties"]["webhook"]["description"]
    assert "header values included" in leased
