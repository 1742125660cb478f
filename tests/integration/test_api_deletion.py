"""``DELETE /v1/jobs/{id}`` and ``DELETE /v1/tenants/{id}`` over HTTP, on both backends:
who may, what is refused while in progress, what a worker still running a deleted run
is told, and bad input changing nothing."""

from __future__ import annotations

import uuid
from typing import Any

from answers import error_of, parse

from cronwheel.api.auth import hash_key
from cronwheel.logstore import FileLogStore

TS = "2031-03-04T12:00:00.250Z"


async def leased(api: Any, tenant: Any, **job: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """A job of ``tenant`` fired and leased by a fresh worker: its key and the lease."""
    created = await api.job(tenant, **job)
    await api.fire()
    worker = await api.key(tenant, "worker")
    r = await api.client.post("/v1/workers", json={}, headers=worker)
    assert r.status_code == 200, r.text
    r = await api.client.post(
        f"/v1/workers/{r.json()['worker_id']}/lease", json={"max": 1}, headers=worker
    )
    assert r.status_code == 200, r.text
    [attempt] = r.json()["attempts"]
    assert attempt["run_id"] == created["first_run_id"]
    return worker, attempt


async def test_a_job_is_deleted_with_its_runs_and_the_deletion_is_audited(api: Any) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", json={}, headers=t.headers)
    assert r.status_code == 200
    # Cancelled, its history is still there to read.
    r = await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"

    r = await api.client.delete(
        f"/v1/jobs/{job['id']}", params={"reason": "replaced"}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["name"], body["deleted"]) == (job["id"], "job", True)
    assert (body["runs_deleted"], body["runs_stopped"]) == (1, [])
    parse(body["deleted_at"])

    for path in (f"/v1/jobs/{job['id']}", f"/v1/runs/{job['first_run_id']}"):
        r = await api.client.get(path, headers=t.headers)
        assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await api.client.get("/v1/runs", params={"job_id": job["id"]}, headers=t.headers)
    assert r.json()["items"] == []
    r = await api.client.delete(f"/v1/jobs/{job['id']}", headers=t.headers)
    assert r.status_code == 404

    events = (await api.store.events_list(uuid.UUID(t.id), job_id=uuid.UUID(job["id"]))).items
    [record] = [e for e in events if e.kind == "job.deleted"]
    operator = await api.store.api_keys_get_by_hash(key_hash=hash_key(t.key))
    assert record.actor == str(operator.id) and record.reason == "replaced"
    assert record.data["role"] == "operator" and record.data["name"] == "job"


async def test_who_may_delete_a_job_and_bad_input_changes_nothing(api: Any) -> None:
    t, other = await api.tenant(), await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    viewer = await api.key(t, "viewer")
    before = await api.snapshot(t)

    r = await api.client.delete(f"/v1/jobs/{job['id']}", headers=viewer)
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    r = await api.client.delete(f"/v1/jobs/{job['id']}", headers=other.headers)
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await api.client.delete(f"/v1/jobs/{job['id']}", headers=api.admin)
    assert r.status_code == 400 and error_of(r)["code"] == "tenant_required"
    for params, field in (({"force": "maybe"}, "force"), ({"reason": "x" * 1001}, "reason")):
        r = await api.client.delete(f"/v1/jobs/{job['id']}", params=params, headers=t.headers)
        assert r.status_code == 422 and error_of(r)["field"] == field, r.text
    for ident in ("not-a-uuid", str(uuid.uuid4())):
        r = await api.client.delete(f"/v1/jobs/{ident}", headers=t.headers)
        assert r.status_code == 404, r.text
    assert await api.snapshot(t) == before

    # The admin key acting for the tenant may.
    r = await api.client.delete(
        f"/v1/jobs/{job['id']}", headers={**api.admin, "Cronwheel-Tenant": t.id}
    )
    assert r.status_code == 200, r.text


async def test_runs_in_progress_refuse_the_deletion_until_forced(api: Any) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    job_id = (await api.client.get(f"/v1/runs/{attempt['run_id']}", headers=t.headers)).json()[
        "job_id"
    ]
    r = await api.client.post(
        f"/v1/attempts/{attempt['attempt_id']}/logs",
        json={
            "fencing_token": attempt["fencing_token"],
            "lines": [{"ts": TS, "level": "INFO", "message": "hi"}],
        },
        headers=worker,
    )
    assert r.status_code == 200, r.text
    logs = api.app.state.logs
    assert isinstance(logs, FileLogStore)
    run_dir = logs.run_dir(uuid.UUID(t.id), uuid.UUID(attempt["run_id"]))
    assert run_dir.exists()

    before = await api.snapshot(t)
    r = await api.client.delete(f"/v1/jobs/{job_id}", headers=t.headers)
    assert r.status_code == 409, r.text
    err = error_of(r)
    assert err["code"] == "in_use" and attempt["run_id"] in err["message"]
    assert "RUNNING" in err["message"] and "force" in err["message"]
    assert err["details"]["runs"] == [{"id": attempt["run_id"], "state": "RUNNING"}]
    assert await api.snapshot(t) == before

    r = await api.client.delete(f"/v1/jobs/{job_id}", params={"force": "true"}, headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["runs_stopped"] == [{"id": attempt["run_id"], "state": "RUNNING"}]
    assert not run_dir.exists()

    # The worker still running it: every report is refused as stale, nothing comes back.
    token = {"fencing_token": attempt["fencing_token"]}
    for action, body in (
        ("heartbeat", token),
        ("complete", {**token, "result": {"rows": 1}}),
        ("fail", {**token, "error": "late"}),
        ("logs", {**token, "lines": [{"ts": TS, "level": "INFO", "message": "late"}]}),
    ):
        r = await api.client.post(
            f"/v1/attempts/{attempt['attempt_id']}/{action}", json=body, headers=worker
        )
        assert r.status_code == 409, (action, r.text)
        assert error_of(r)["code"] == "stale_fencing_token"
    r = await api.client.get(f"/v1/runs/{attempt['run_id']}", headers=t.headers)
    assert r.status_code == 404
    assert not run_dir.exists()


# -- tenants -------------------------------------------------------------------------


async def test_a_tenant_is_deleted_with_its_keys_which_stop_working_at_once(api: Any) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 3600})
    viewer = await api.key(t, "viewer")
    # The keys are cached by now.
    for headers in (t.headers, viewer):
        assert (await api.client.get("/v1/jobs", headers=headers)).status_code == 200

    r = await api.client.delete(f"/v1/tenants/{t.id}", headers=api.admin)
    assert r.status_code == 409, r.text
    err = error_of(r)
    assert err["code"] == "in_use" and job["id"] in err["message"]
    assert err["details"]["jobs"] == [{"id": job["id"], "state": "active"}]
    assert (await api.client.get(f"/v1/tenants/{t.id}", headers=api.admin)).status_code == 200

    r = await api.client.delete(
        f"/v1/tenants/{t.id}", params={"force": "true", "reason": "left"}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["name"], body["jobs_deleted"], body["runs_deleted"]) == (
        t.id,
        t.name,
        1,
        1,
    )
    assert (body["api_keys_deleted"], body["workers_deleted"], body["runs_stopped"]) == (2, 0, 0)

    for headers in (t.headers, viewer):
        r = await api.client.get("/v1/jobs", headers=headers)
        assert r.status_code == 401 and error_of(r)["code"] == "unauthorized"
    r = await api.client.get("/v1/jobs", headers={**api.admin, "Cronwheel-Tenant": t.id})
    assert r.status_code == 404
    assert (await api.client.get(f"/v1/tenants/{t.id}", headers=api.admin)).status_code == 404
    names = [
        x["name"] for x in (await api.client.get("/v1/tenants", headers=api.admin)).json()["items"]
    ]
    assert t.name not in names
    [record] = [
        e
        for e in (await api.store.events_list(None, limit=1000)).items
        if e.kind == "tenant.deleted"
    ]
    assert (record.tenant_id, record.actor, record.reason) == (uuid.UUID(t.id), "admin", "left")
    assert record.data["force"] is True and record.data["role"] == "admin"


async def test_only_the_admin_deletes_tenants_and_bad_input_changes_nothing(api: Any) -> None:
    t = await api.tenant()
    await api.job(t, schedule={"delay": 3600})
    worker = await api.key(t, "worker")
    before = await api.snapshot(t)
    for headers in (t.headers, worker):
        r = await api.client.delete(f"/v1/tenants/{t.id}", headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    r = await api.client.delete(f"/v1/tenants/{t.id}", params={"force": "x"}, headers=api.admin)
    assert r.status_code == 422 and error_of(r)["field"] == "force"
    for ident in ("nope", str(uuid.uuid4())):
        r = await api.client.delete(f"/v1/tenants/{ident}", headers=api.admin)
        assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    assert await api.snapshot(t) == before
    assert (await api.client.get("/v1/jobs", headers=t.headers)).status_code == 200
