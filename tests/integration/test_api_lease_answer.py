"""A lease's answer is written straight to JSON, without a model per attempt: it must
still be exactly the documented ``LeaseOut``, on both backends — every field, instants in
UTC with a ``Z``, and a payload as it was given, an integer past 64 bits and text
outside ASCII included — and the schema must still say so."""

from __future__ import annotations

from cronwheel.api.worker_schemas import LeaseOut

PAYLOAD = {"big": 2**70, "negative": -(2**65), "text": "café ☕", "nested": [{"n": 1.5}, None]}


async def test_a_lease_answers_the_documented_body_with_the_payload_intact(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="leased", payload=PAYLOAD, priority=1)
    await api.fire()
    worker = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={"pool": "default"}, headers=worker)
    worker_id = r.json()["worker_id"]

    r = await api.client.post(f"/v1/workers/{worker_id}/lease", json={"max": 5}, headers=worker)

    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    answer = LeaseOut.model_validate(body)
    assert set(body) == set(LeaseOut.model_fields)
    [leased] = body["attempts"]
    assert set(leased) == set(LeaseOut.model_fields["attempts"].annotation.__args__[0].model_fields)
    assert leased["payload"] == PAYLOAD  # 2**70 is still an integer, not a float
    assert (leased["run_id"], leased["job_id"], leased["tenant_id"]) == (
        job["first_run_id"],
        job["id"],
        t.id,
    )
    assert (leased["attempt"], leased["task"], leased["priority"]) == (1, "t.run", 1)
    assert leased["webhook"] is None and leased["signing_secret"] is None
    assert leased["not_before"] is None and leased["workflow_run_id"] is None
    for field in ("lease_expires_at", "deadline", "due_at"):
        assert leased[field].endswith("Z"), leased[field]
    assert body["now"].endswith("Z")
    [attempt] = answer.attempts
    run = await api.store.runs_get(attempt.tenant_id, attempt.run_id)
    assert run.state.value == "RUNNING" and attempt.due_at == run.due_at


async def test_the_schema_still_documents_the_lease_answer(api) -> None:
    r = await api.client.get("/openapi.json")
    route = r.json()["paths"]["/v1/workers/{worker_id}/lease"]["post"]
    schema = route["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/LeaseOut"}
