"""Gated reservations over HTTP, on both backends: a lease with ``gated`` holds the
nodes after a running one; the gates long-poll answers as soon as the upstream's
completion opens them, with the payload each runs with; the start records them
RUNNING; and what the routes refuse."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from answers import error_of
from test_api_workers import lease, register
from test_api_workflows import create, run_of, states

from cronwheel.domain import workflow


@pytest.fixture(autouse=True)
def _every_node_a_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small DAGs here: every node after others is held ahead (by default only layers
    of GATE_LAYER_MIN are; see the test of it)."""
    monkeypatch.setattr(workflow, "GATE_LAYER_MIN", 1)


async def _diamond_running(api) -> tuple[Any, dict[str, str], str, str, dict[str, Any]]:
    """A diamond fired, its root leased by a worker: (tenant, worker headers, worker
    id, workflow run id, the root's attempt)."""
    t = await api.tenant()
    wf = await create(api, t)
    await api.fire()
    headers = await api.key(t, "worker")
    wid = await register(api, headers)
    [root] = await lease(api, headers, wid, max=10)
    assert root["task"] == "etl.extract" and root["gated"] is False
    return t, headers, wid, wf["first_run_id"], root


async def test_registration_offers_the_gates_long_poll(api) -> None:
    t = await api.tenant()
    headers = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={}, headers=headers)
    assert r.json()["gates_poll"] is True


async def test_a_gate_opens_at_the_upstreams_end_and_the_holder_starts_the_nodes(api) -> None:
    t, headers, wid, run_id, root = await _diamond_running(api)
    gated = await lease(api, headers, wid, max=10, gated=10)
    assert sorted(a["task"] for a in gated) == ["etl.left", "etl.right"]
    assert all(a["gated"] and a["not_before"] is None for a in gated)
    tokens = [a["fencing_token"] for a in gated]
    assert states(await run_of(api, t, run_id))["left"] == "PENDING"
    # The long-poll waits while the root runs, and answers once its completion commits.
    poll = asyncio.create_task(
        api.client.post(
            f"/v1/workers/{wid}/gates",
            json={"fencing_tokens": tokens, "wait": 10},
            headers=headers,
        )
    )
    await asyncio.sleep(0.2)
    assert not poll.done()
    r = await api.client.post(
        f"/v1/attempts/{root['attempt_id']}/complete",
        json={"fencing_token": root["fencing_token"], "result": {"rows": 3}},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    answer = await asyncio.wait_for(poll, 5)
    assert answer.status_code == 200, answer.text
    [opened] = answer.json()["opened"]
    assert sorted(opened["fencing_tokens"]) == sorted(tokens)
    assert opened["payload"] == {"upstream": {"extract": {"rows": 3}}}
    assert answer.json()["gone"] == []
    r = await api.client.post(
        f"/v1/workers/{wid}/start", json={"fencing_tokens": tokens}, headers=headers
    )
    assert sorted(r.json()["started"]) == sorted(tokens)
    assert r.json()["started_at"] == opened["opened_at"]
    assert states(await run_of(api, t, run_id)) == {
        "extract": "SUCCESS",
        "left": "RUNNING",
        "right": "RUNNING",
        "load": "PENDING",
    }
    # Started: heartbeaten and completed as any attempt.
    for a in gated:
        r = await api.client.post(
            f"/v1/attempts/{a['attempt_id']}/complete",
            json={"fencing_token": a["fencing_token"], "result": {"by": a["task"]}},
            headers=headers,
        )
        assert r.status_code == 200, r.text
    [load] = await lease(api, headers, wid, max=10)
    assert load["task"] == "etl.load"
    assert load["payload"]["upstream"] == {
        "left": {"by": "etl.left"},
        "right": {"by": "etl.right"},
    }


async def test_a_gate_that_cannot_open_answers_gone(api) -> None:
    _t, headers, wid, _run_id, root = await _diamond_running(api)
    gated = await lease(api, headers, wid, max=10, gated=10)
    r = await api.client.post(
        f"/v1/attempts/{root['attempt_id']}/fail",
        json={"fencing_token": root["fencing_token"], "error": "boom", "retryable": False},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    tokens = sorted(a["fencing_token"] for a in gated)
    r = await api.client.post(
        f"/v1/workers/{wid}/gates", json={"fencing_tokens": tokens, "wait": 5}, headers=headers
    )
    assert r.json() == {"opened": [], "gone": tokens}


async def test_bad_gates_and_gated_requests_are_refused(api) -> None:
    _t, headers, wid, _run_id, _root = await _diamond_running(api)
    gates = f"/v1/workers/{wid}/gates"
    for body, field in [
        ({"fencing_tokens": []}, "fencing_tokens"),
        ({"fencing_tokens": [1], "wait": 10_000}, "wait"),
        ({"fencing_tokens": [1], "wait": -1}, "wait"),
        ({"fencing_tokens": [1], "extra": True}, "extra"),
    ]:
        r = await api.client.post(gates, json=body, headers=headers)
        assert r.status_code == 422, r.text
        assert field in r.text, (body, r.text)
    r = await api.client.post(
        f"/v1/workers/{wid}/lease", json={"max": 1, "gated": 1001}, headers=headers
    )
    assert r.status_code == 422 and "gated" in r.text
    # Another worker's reservations are not this one's to hear of.
    gated = await lease(api, headers, wid, max=10, gated=10)
    other = await register(api, headers)
    r = await api.client.post(
        f"/v1/workers/{other}/gates",
        json={"fencing_tokens": [a["fencing_token"] for a in gated]},
        headers=headers,
    )
    assert sorted(r.json()["gone"]) == sorted(a["fencing_token"] for a in gated)
    # A deregistered worker hears of nothing.
    r = await api.client.delete(f"/v1/workers/{wid}", headers=headers)
    assert r.status_code == 200
    r = await api.client.post(gates, json={"fencing_tokens": [1]}, headers=headers)
    assert r.status_code == 410 and error_of(r)["code"] == "worker_deregistered"
