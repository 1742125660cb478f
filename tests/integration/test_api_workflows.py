"""Workflows over HTTP, on both backends: what creating one refuses (and that nothing is
stored then), a diamond run by a worker through the worker protocol with results passed
down, listing runs with node states, cancelling a run, retrying a node, and the job
operations a workflow shares."""

from __future__ import annotations

from typing import Any

from answers import error_of
from test_api_workers import lease, register

from conftest import MAX_PAYLOAD

DIAMOND: list[dict[str, Any]] = [
    {"name": "extract", "task": "etl.extract"},
    {"name": "left", "task": "etl.left", "after": ["extract"]},
    {"name": "right", "task": "etl.right", "after": ["extract"]},
    {"name": "load", "task": "etl.load", "after": ["left", "right"], "payload": {"to": "db"}},
]


def body(nodes: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "name": "etl",
        "schedule": {"asap": True},
        "nodes": DIAMOND if nodes is None else nodes,
        **fields,
    }


async def create(api, tenant, **fields: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/workflows", json=body(**fields), headers=tenant.headers)
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


async def run_of(api, tenant, run_id: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def states(run: dict[str, Any]) -> dict[str, str]:
    return {n["node"]: n["state"] for n in run["nodes"]}


async def work(api, headers: dict[str, str], wid: str, fail: set[str] = frozenset()) -> list[str]:
    """Lease what is ready and end it: fail the tasks in ``fail``, complete the rest
    with a result naming the task. Returns the tasks leased."""
    leased = await lease(api, headers, wid, max=50)
    for a in leased:
        if a["task"] in fail:
            r = await api.client.post(
                f"/v1/attempts/{a['attempt_id']}/fail",
                json={"fencing_token": a["fencing_token"], "error": "boom", "retryable": False},
                headers=headers,
            )
        else:
            r = await api.client.post(
                f"/v1/attempts/{a['attempt_id']}/complete",
                json={"fencing_token": a["fencing_token"], "result": {"by": a["task"]}},
                headers=headers,
            )
        assert r.status_code == 200, r.text
    return sorted(a["task"] for a in leased)


async def test_bad_workflows_are_refused_and_nothing_is_stored(api) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    cases: list[tuple[dict[str, Any], str, str]] = [
        (
            body(
                [
                    {"name": "a", "task": "x", "after": ["c"]},
                    {"name": "b", "task": "x", "after": ["a"]},
                    {"name": "c", "task": "x", "after": ["b"]},
                ]
            ),
            "a cycle: ",
            "nodes",
        ),
        (
            body([{"name": "a", "task": "x", "after": ["nope"]}]),
            "no node is named 'nope'",
            "nodes.0.after.0",
        ),
        (
            body([{"name": "a", "task": "x"}, {"name": "a", "task": "y"}]),
            "two nodes are named 'a'",
            "nodes.1.name",
        ),
        (body([{"name": "a", "task": "x", "after": ["a"]}]), "a cycle: a -> a", "nodes.0.after"),
        (body([{"name": f"n{i}", "task": "x"} for i in range(2001)]), "2000", "nodes"),
        (body([]), "at least 1", "nodes"),
        (body([{"name": "a"}]), "exactly one of 'task' or 'webhook'", "nodes.0"),
        (body([{"name": "a b", "task": "x"}]), "'a b': a node name", "nodes.0.name"),
        (body([{"name": "..", "task": "x"}]), "dots alone", "nodes.0.name"),
        (body([{"name": ".", "task": "x"}]), "dots alone", "nodes.0.name"),
        (
            body([{"name": "a", "task": "x", "trigger_rule": "sometimes"}]),
            "",
            "nodes.0.trigger_rule",
        ),
        (
            body([{"name": "a", "task": "x", "payload": {"upstream": 1}}]),
            "upstream",
            "nodes.0.payload",
        ),
        (body([{"name": "a", "task": "x", "timeout": -1}]), "", "nodes.0.timeout"),
        # A node's field is shown with the node's name: known by it, not by its place.
        (
            body([{"name": "a", "task": "x"}, {"name": "load", "task": "x", "timeout": -1}]),
            "nodes.1.timeout (node 'load'): ",
            "nodes.1.timeout",
        ),
        (body(schedule={"cron": "61 * * * *"}), "", "schedule"),
    ]
    for sent, message, field in cases:
        r = await api.client.post("/v1/workflows", json=sent, headers=t.headers)
        assert r.status_code == 422, (sent, r.text)
        error = error_of(r)
        assert message in error["message"], (message, error)
        assert (error.get("field") or "").startswith(field), (field, error)
    assert await api.snapshot(t) == before
    r = await api.client.get("/v1/workflows", headers=t.headers)
    assert r.json()["items"] == []


async def test_a_diamond_runs_through_the_worker_protocol(api) -> None:
    t = await api.tenant()
    wf = await create(api, t)
    assert [n["name"] for n in wf["nodes"]] == ["extract", "left", "right", "load"]
    assert wf["nodes"][3]["after"] == ["left", "right"]
    assert wf["nodes"][3]["trigger_rule"] == "all_success"
    run_id = wf["first_run_id"]
    pending = await run_of(api, t, run_id)
    assert pending["state"] == "SCHEDULED" and pending["counts"] == {"PENDING": 4}
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    assert await work(api, worker, wid) == ["etl.extract"]
    assert states(await run_of(api, t, run_id)) == {
        "extract": "SUCCESS",
        "left": "DISPATCHED",
        "right": "DISPATCHED",
        "load": "PENDING",
    }
    assert await work(api, worker, wid) == ["etl.left", "etl.right"]
    leased = await lease(api, worker, wid, max=50)
    assert [a["task"] for a in leased] == ["etl.load"]
    assert leased[0]["payload"] == {
        "to": "db",
        "upstream": {"left": {"by": "etl.left"}, "right": {"by": "etl.right"}},
    }
    r = await api.client.post(
        f"/v1/attempts/{leased[0]['attempt_id']}/complete",
        json={"fencing_token": leased[0]["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    done = await run_of(api, t, run_id)
    assert done["state"] == "SUCCESS" and done["counts"] == {"SUCCESS": 4}
    # A node's run is a run: its events are the run's.
    node = done["nodes"][3]
    r = await api.client.get(f"/v1/runs/{node['run_id']}", headers=t.headers)
    assert r.json()["workflow_run_id"] == run_id and r.json()["node"] == "load"
    r = await api.client.get(f"/v1/runs/{node['run_id']}/events", headers=t.headers)
    moves = [(e["from_state"], e["to_state"]) for e in r.json()["items"]]
    assert moves == [
        (None, "PENDING"),
        ("PENDING", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    r = await api.client.get(f"/v1/workflows/{wf['id']}/runs", headers=t.headers)
    [listed] = r.json()["items"]
    assert listed["id"] == run_id and listed["counts"] == {"SUCCESS": 4}
    assert listed["nodes"] is None
    # A one-off workflow is over once its run is.
    r = await api.client.get(f"/v1/workflows/{wf['id']}", headers=t.headers)
    assert r.json()["state"] == "finished"


async def test_failure_skips_then_a_retry_continues(api) -> None:
    t = await api.tenant()
    wf = await create(api, t, nodes=[{**n, "retry": {"max_attempts": 1}} for n in DIAMOND])
    run_id = wf["first_run_id"]
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    await work(api, worker, wid)
    await work(api, worker, wid, fail={"etl.left"})
    failed = await run_of(api, t, run_id)
    assert failed["state"] == "FAILED"
    assert states(failed) == {
        "extract": "SUCCESS",
        "left": "FAILED",
        "right": "SUCCESS",
        "load": "SKIPPED",
    }
    assert "upstream failed: left" in failed["nodes"][3]["reason"]
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/nodes/right/retry", headers=t.headers)
    assert r.status_code == 409, r.text
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/nodes/nope/retry", headers=t.headers)
    assert r.status_code == 404, r.text
    r = await api.client.post(f"/v1/runs/{run_id}/retry", headers=t.headers)
    assert r.status_code == 409 and "retry its failed nodes" in r.text
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/nodes/left/retry", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "RUNNING"
    assert states(r.json())["load"] == "PENDING"
    await api.fire()
    assert await work(api, worker, wid) == ["etl.left"]
    assert await work(api, worker, wid) == ["etl.load"]
    assert (await run_of(api, t, run_id))["state"] == "SUCCESS"


async def test_a_trigger_payload_is_checked_as_the_nodes_payloads_are(api) -> None:
    # Merged over every node's own payload: the upstream key is refused, and so is a
    # payload that makes a node's too large. Nothing is fired either way.
    t = await api.tenant()
    big = "x" * (MAX_PAYLOAD // 2)
    nodes = [{**DIAMOND[0], "payload": {"own": big}}, *DIAMOND[1:]]
    wf = await create(api, t, nodes=nodes, schedule={"cron": "0 0 1 1 *"})
    before = await api.snapshot(t)
    path = f"/v1/workflows/{wf['id']}/trigger"
    r = await api.client.post(path, json={"payload": {"upstream": {"a": 1}}}, headers=t.headers)
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert error["field"] == "payload" and "'upstream'" in error["message"]
    r = await api.client.post(path, json={"payload": {"more": big}}, headers=t.headers)
    assert r.status_code == 413, r.text
    error = error_of(r)
    assert error["field"] == "payload" and "node 'extract'" in error["message"]
    assert await api.snapshot(t) == before
    r = await api.client.post(path, json={"payload": {"more": "x"}}, headers=t.headers)
    assert r.status_code == 201, r.text


async def test_a_node_whose_rule_can_no_longer_hold_is_not_retried(api) -> None:
    # Cancelled with its run, load cannot run until left and right are retried: the
    # retry is refused, and nothing changes.
    t = await api.tenant()
    wf = await create(api, t)
    run_id = wf["first_run_id"]
    await api.fire()
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    before = await run_of(api, t, run_id)
    assert states(before)["load"] == "CANCELLED"
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/nodes/load/retry", headers=t.headers)
    assert r.status_code == 409, r.text
    error = error_of(r)
    assert "cannot run: upstream failed: left, right" in error["message"]
    assert "retry its upstream nodes first" in error["message"]
    # The same through the run's own retry.
    load = next(n for n in before["nodes"] if n["node"] == "load")
    r = await api.client.post(f"/v1/runs/{load['run_id']}/retry", headers=t.headers)
    assert r.status_code == 409 and "cannot run" in error_of(r)["message"], r.text
    assert await run_of(api, t, run_id) == before


async def test_cancel_a_run_and_the_job_operations(api) -> None:
    t = await api.tenant()
    other = await api.tenant()
    wf = await create(api, t, schedule={"cron": "0 0 1 1 *"})
    assert wf["state"] == "active" and wf["next_due_at"] is not None
    for path in (f"/v1/workflows/{wf['id']}", f"/v1/workflows/{wf['id']}/runs"):
        r = await api.client.get(path, headers=other.headers)
        assert r.status_code == 404, r.text
    r = await api.client.post(f"/v1/workflows/{wf['id']}/pause", headers=t.headers)
    assert r.json()["state"] == "paused"
    r = await api.client.post(f"/v1/workflows/{wf['id']}/resume", headers=t.headers)
    assert r.json()["state"] == "active"
    r = await api.client.post(
        f"/v1/workflows/{wf['id']}/trigger", json={"payload": {"day": 3}}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    assert r.json()["origin"] == "trigger"
    r = await api.client.get(f"/v1/workflow-runs/{run_id}", headers=other.headers)
    assert r.status_code == 404
    # One cancelled before it fires never runs a node.
    r = await api.client.post(f"/v1/workflows/{wf['id']}/trigger", headers=t.headers)
    never = r.json()["id"]
    r = await api.client.post(f"/v1/workflow-runs/{never}/cancel", headers=t.headers)
    assert r.json()["state"] == "CANCELLED", r.text
    assert r.json()["counts"] == {"SKIPPED": 4}
    assert {n["state"] for n in r.json()["nodes"]} == {"SKIPPED"}
    assert "ended CANCELLED before it started" in r.json()["nodes"][0]["reason"]
    r = await api.client.post(f"/v1/workflow-runs/{never}/nodes/load/retry", headers=t.headers)
    assert r.status_code == 409 and "before it started" in error_of(r)["message"], r.text
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker)
    [a] = await lease(api, worker, wid, max=50)
    assert a["payload"] == {"day": 3}
    r = await api.client.post(f"/v1/workflow-runs/{run_id}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "RUNNING"
    assert states(r.json()) == {
        "extract": "RUNNING",
        "left": "CANCELLED",
        "right": "CANCELLED",
        "load": "CANCELLED",
    }
    r = await api.client.post(
        f"/v1/attempts/{a['attempt_id']}/complete",
        json={"fencing_token": a["fencing_token"]},
        headers=worker,
    )
    assert r.json()["run_state"] == "CANCELLED", r.text
    assert (await run_of(api, t, run_id))["state"] == "CANCELLED"
    # A workflow is not a job to edit or override; the jobs list leaves it out.
    r = await api.client.patch(f"/v1/jobs/{wf['id']}", json={"priority": 1}, headers=t.headers)
    assert r.status_code == 409 and "workflow" in r.text
    r = await api.client.post(
        f"/v1/jobs/{wf['id']}/overrides",
        json={"scope": "next", "priority": 1},
        headers=t.headers,
    )
    assert r.status_code in (409, 422) and "workflow" in r.text, r.text
    r = await api.client.get("/v1/jobs", headers=t.headers)
    assert all(j["id"] != wf["id"] for j in r.json()["items"])
    # Its runs are filtered by a workflow run's states: a node's own are refused.
    r = await api.client.get(f"/v1/workflows/{wf['id']}/runs?state=PENDING", headers=t.headers)
    assert r.status_code == 422 and "'PENDING' is not a workflow run's state" in r.text
    r = await api.client.get(f"/v1/workflows/{wf['id']}/runs?state=SKIPPED", headers=t.headers)
    assert r.status_code == 200 and r.json()["items"] == []
    # A workflow with a run in progress is deleted only by force, and says it is one.
    r = await api.client.post(f"/v1/workflows/{wf['id']}/trigger", headers=t.headers)
    await api.fire()
    r = await api.client.delete(f"/v1/workflows/{wf['id']}", headers=t.headers)
    assert r.status_code == 409, r.text
    said = error_of(r)["message"]
    assert said.startswith(f"workflow {wf['id']} has 2 runs in progress"), said
    assert "cancel the workflow and let them finish" in said and "job" not in said
    r = await api.client.delete(f"/v1/workflows/{wf['id']}?force=true", headers=t.headers)
    assert r.status_code == 200, r.text
    r = await api.client.get(f"/v1/workflows/{wf['id']}", headers=t.headers)
    assert r.status_code == 404


async def test_workflows_are_listed_by_state_and_tag(api) -> None:
    t = await api.tenant()
    nightly = await create(api, t, name="nightly", tags=["etl"], schedule={"cron": "0 2 * * *"})
    hourly = await create(api, t, name="hourly", schedule={"cron": "0 * * * *"})
    r = await api.client.post(f"/v1/workflows/{hourly['id']}/pause", headers=t.headers)
    assert r.status_code == 200, r.text

    async def listed(query: str) -> list[str]:
        r = await api.client.get(f"/v1/workflows?{query}", headers=t.headers)
        assert r.status_code == 200, r.text
        return [w["name"] for w in r.json()["items"]]

    assert await listed("tag=etl") == ["nightly"]
    assert await listed("tag=none") == []
    assert await listed("state=paused") == ["hourly"]
    assert await listed("state=active&tag=etl") == ["nightly"]
    assert await listed("") == ["hourly", "nightly"]
    r = await api.client.get("/v1/workflows?state=bogus", headers=t.headers)
    assert r.status_code == 422 and error_of(r)["field"] == "state", r.text
    # A query parameter the route does not take is refused, not ignored: a misspelt
    # filter would otherwise answer every workflow.
    r = await api.client.get("/v1/workflows?tags=etl", headers=t.headers)
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "tags"
    assert error_of(r)["message"] == (
        "tags: not a query parameter of this route; this route takes cursor, limit,"
        " name_prefix, state, tag"
    )
    r = await api.client.get(f"/v1/workflows/{nightly['id']}?verbose=1", headers=t.headers)
    assert r.status_code == 422 and "takes" not in error_of(r)["message"], r.text


async def test_a_key_given_twice_is_refused_and_nothing_is_stored(api) -> None:
    t = await api.tenant()
    text = (
        '{"name": "x", "schedule": {"asap": true},'
        ' "nodes": [{"name": "a", "task": "etl.extract", "task": "rm.everything"}]}'
    )
    r = await api.client.post(
        "/v1/workflows",
        content=text,
        headers={**t.headers, "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["message"] == (
        "the request body is ambiguous: the key 'task' is given twice in one object"
    )
    r = await api.client.get("/v1/workflows", headers=t.headers)
    assert r.json()["items"] == []


async def test_an_idempotency_key_makes_a_retried_creation_the_first(api) -> None:
    t = await api.tenant()
    key = {**t.headers, "Idempotency-Key": "nightly-etl-2030-01-01"}
    r = await api.client.post("/v1/workflows", json=body(), headers=key)
    assert r.status_code == 201, r.text
    first = r.json()
    r = await api.client.post("/v1/workflows", json=body(), headers=key)
    assert r.status_code == 200, r.text
    assert r.json() == first
    # The same key with another DAG is not the same request.
    other = body(nodes=[{"name": "only", "task": "etl.extract"}])
    r = await api.client.post("/v1/workflows", json=other, headers=key)
    assert r.status_code == 409 and error_of(r)["code"] == "idempotency_conflict", r.text
    # Nor is a job created under it.
    job = {"name": "etl", "schedule": {"asap": True}, "task": "etl.extract"}
    r = await api.client.post("/v1/jobs", json=job, headers=key)
    assert r.status_code == 409 and error_of(r)["code"] == "idempotency_conflict", r.text
    r = await api.client.get("/v1/workflows", headers=t.headers)
    assert [w["id"] for w in r.json()["items"]] == [first["id"]]
    assert len(r.json()["items"][0]["nodes"]) == len(DIAMOND)
