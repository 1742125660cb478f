"""Dead letters: listed, redriven for a new series of attempts, retried; tenant-scoped."""

from __future__ import annotations

import uuid

from cronwheel.store import FailItem, Store


async def _dead_letter(api, store: Store, tenant) -> str:  # type: ignore[no-untyped-def]
    job = await api.job(tenant, schedule={"asap": True}, retry={"max_attempts": 1})
    await api.fire()
    worker = await store.workers_register(
        uuid.UUID(tenant.id), pool="default", capabilities=[], tags=[], capacity=1
    )
    [attempt] = await store.attempts_lease(worker=worker, max=1)
    await store.attempts_fail_many(items=[FailItem(attempt.attempt_id, attempt.fencing_token, "x")])
    run = await store.runs_get(uuid.UUID(tenant.id), uuid.UUID(job["first_run_id"]))
    assert run.state.value == "DEAD_LETTER"
    return str(run.id)


async def test_dead_letters_are_listed_and_redriven(api, store: Store) -> None:
    t = await api.tenant()
    run_id = await _dead_letter(api, store, t)
    listed = await api.client.get("/v1/dead-letters", headers=t.headers)
    assert listed.status_code == 200
    assert [r["id"] for r in listed.json()["items"]] == [run_id]
    assert listed.json()["items"][0]["last_error"] == "x"

    r = await api.client.post(f"/v1/runs/{run_id}/redrive", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "SCHEDULED"
    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(run_id))
    assert (run.attempt, run.max_attempts, run.finished_at) == (1, 2, None)
    job = await store.jobs_get(uuid.UUID(t.id), run.job_id)
    assert job.state.value == "active"  # the finished one-off job runs again
    assert (await api.client.get("/v1/dead-letters", headers=t.headers)).json()["items"] == []
    events = (await store.events_list(uuid.UUID(t.id), run_id=run.id)).items
    assert (events[-1].from_state, events[-1].to_state) == ("DEAD_LETTER", "SCHEDULED")

    # Only a dead letter can be redriven: now it is SCHEDULED.
    again = await api.client.post(f"/v1/runs/{run_id}/redrive", headers=t.headers)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "illegal_transition"
    # Nor retried, being under way again; both 409s are in the schema.
    r = await api.client.post(f"/v1/runs/{run_id}/retry", headers=t.headers)
    assert r.status_code == 409 and r.json()["error"]["code"] == "illegal_transition"
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    for action in ("redrive", "retry"):
        assert "409" in paths[f"/v1/runs/{{run_id}}/{action}"]["post"]["responses"], action


async def test_retry_a_cancelled_run_and_isolation(api, store: Store) -> None:
    t = await api.tenant()
    other = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    run_id = job["first_run_id"]
    assert (
        await api.client.post(f"/v1/runs/{run_id}/cancel", headers=t.headers)
    ).status_code == 200
    # Another tenant's key cannot see it.
    r = await api.client.post(f"/v1/runs/{run_id}/retry", headers=other.headers)
    assert r.status_code == 404
    r = await api.client.post(f"/v1/runs/{run_id}/redrive", headers=t.headers)
    assert r.status_code == 409  # cancelled is not a dead letter
    r = await api.client.post(f"/v1/runs/{run_id}/retry", headers=t.headers)
    assert r.status_code == 200 and r.json()["state"] == "SCHEDULED"
    viewer = await api.key(t, "viewer")
    r = await api.client.post(f"/v1/runs/{run_id}/retry", headers=viewer)
    assert r.status_code == 403


async def _triggered_dead_letter(api, store: Store, tenant) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A recurring job (still active) and its triggered run, dead-lettered."""
    job = await api.job(tenant, schedule={"interval": 3600}, retry={"max_attempts": 1})
    r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=tenant.headers)
    assert r.status_code == 201, r.text
    await api.fire()
    worker = await store.workers_register(
        uuid.UUID(tenant.id), pool="default", capabilities=[], tags=[], capacity=1
    )
    [attempt] = await store.attempts_lease(worker=worker, max=1)
    await store.attempts_fail_many(items=[FailItem(attempt.attempt_id, attempt.fencing_token, "x")])
    return job["id"], r.json()["id"]


async def test_the_job_decides_whether_a_dead_letter_goes_back(api, store: Store) -> None:  # type: ignore[no-untyped-def]
    t = await api.tenant()
    cancelled_job, refused = await _triggered_dead_letter(api, store, t)
    r = await api.client.post(f"/v1/jobs/{cancelled_job}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    before = await api.snapshot(t)
    for action in ("redrive", "retry"):
        r = await api.client.post(f"/v1/runs/{refused}/{action}", headers=t.headers)
        assert r.status_code == 409, r.text
        assert "its job is cancelled" in r.json()["error"]["message"]
    r = await api.client.post(
        "/v1/dead-letters/redrive", json={"run_ids": [refused]}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    assert r.json()["skipped"] == [{"run_id": refused, "reason": "its job is cancelled"}]
    assert await api.snapshot(t) == before

    paused_job, held = await _triggered_dead_letter(api, store, t)
    r = await api.client.post(f"/v1/jobs/{paused_job}/pause", headers=t.headers)
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/v1/runs/{held}/redrive", headers=t.headers)
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["reason"]) == ("SCHEDULED", "job paused")
