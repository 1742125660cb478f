"""Admission over HTTP: limits set with PATCH /v1/tenants/{id} hold at the next lease,
the P0 reserve comes from the settings, and a long-poll held by a dispatch-rate limit
is answered when its token comes, not at its next re-poll."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_api_workers import lease, register

from cronwheel.metrics import RUNS_THROTTLED
from cronwheel.settings import Settings


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The API tests' settings, with one slot in ten of each worker kept for P0."""
    return settings.model_copy(update={"p0_reserved_share": 0.1})


async def _limits(api, tenant, **limits: Any) -> None:
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": limits}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    assert {k: r.json()["limits"][k] for k in limits} == limits


async def test_max_concurrent_runs_set_by_the_admin_holds_at_the_next_lease(api) -> None:
    t = await api.tenant()
    await _limits(api, t, max_concurrent_runs=2)
    for _ in range(5):
        await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, capacity=5)
    before = RUNS_THROTTLED.labels(tenant=t.name, limit="max_concurrent_runs")._value.get()
    assert len(await lease(api, worker, wid, max=5)) == 2
    assert await lease(api, worker, wid, max=5) == []
    assert (
        RUNS_THROTTLED.labels(tenant=t.name, limit="max_concurrent_runs")._value.get() == before + 2
    )
    metrics = (await api.client.get("/metrics", headers=api.admin)).text
    assert f'cronwheel_runs_throttled_total{{limit="max_concurrent_runs",tenant="{t.name}"}}' in (
        metrics
    )


async def test_lower_classes_leave_the_p0_reserve_of_the_settings(api) -> None:
    t = await api.tenant()
    for _ in range(12):
        await api.job(t, priority=2)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, capacity=10)
    # p0_reserved_share 0.1: one slot of ten stays for P0, and the answer says so.
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 10}, headers=worker)
    assert len(r.json()["attempts"]) == 9 and r.json()["p0_reserved_slots"] == 1
    assert await lease(api, worker, wid, max=1) == []  # the last slot: P0 only
    await api.job(t, priority=0)
    await api.fire()
    [p0] = await lease(api, worker, wid, max=1)
    assert p0["task"] == "t.run"


async def test_a_long_poll_held_by_the_dispatch_rate_is_answered_when_its_token_comes(
    api, app
) -> None:
    app.state.api.lease_poll_interval = 60.0  # the re-poll timer is out of reach
    t = await api.tenant()
    await _limits(api, t, max_dispatch_rate=2.0, dispatch_burst=1)
    for _ in range(2):
        await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, capacity=5)
    assert len(await lease(api, worker, wid, max=5)) == 1  # the burst
    # The second waits for its token (half a second), then comes.
    second = await asyncio.wait_for(lease(api, worker, wid, max=5, wait=10), timeout=8)
    assert len(second) == 1


async def test_a_long_poll_held_by_max_concurrent_runs_is_answered_when_a_run_ends(
    api, app
) -> None:
    app.state.api.lease_poll_interval = 60.0  # the re-poll timer is out of reach
    t = await api.tenant()
    await _limits(api, t, max_concurrent_runs=1)
    for _ in range(2):
        await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, capacity=5)
    [first] = await lease(api, worker, wid, max=5)
    waiting = asyncio.create_task(lease(api, worker, wid, max=5, wait=10))
    await asyncio.sleep(0.2)  # the long-poll is held: the tenant has its one run
    assert not waiting.done()
    r = await api.client.post(
        f"/v1/attempts/{first['attempt_id']}/complete",
        json={"fencing_token": first["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    # Nothing is dispatched, nothing notifies: the held long-poll finds the room itself.
    second = await asyncio.wait_for(waiting, timeout=8)
    assert len(second) == 1 and second[0]["run_id"] != first["run_id"]


async def test_bad_limits_are_refused_and_change_nothing(api) -> None:
    t = await api.tenant()
    await _limits(api, t, max_concurrent_runs=3)
    for bad in (
        {"max_concurrent_runs": 0},
        {"max_dispatch_rate": -1},
        {"dispatch_burst": 0},
        {"weight": 0},
        {"bogus": 1},
    ):
        r = await api.client.patch(f"/v1/tenants/{t.id}", json={"limits": bad}, headers=api.admin)
        assert r.status_code == 422, (bad, r.text)
    r = await api.client.get(f"/v1/tenants/{t.id}", headers=api.admin)
    assert r.json()["limits"]["max_concurrent_runs"] == 3


async def test_a_run_held_by_a_limit_says_which_in_its_wait_reason(api) -> None:
    t = await api.tenant()
    await _limits(api, t, max_concurrent_runs=1)
    first, second = await api.job(t), await api.job(t)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = await register(api, worker, capacity=5)
    [leased] = await lease(api, worker, wid, max=5)
    waiting = second if leased["run_id"] == first["first_run_id"] else first
    r = await api.client.get(f"/v1/runs/{waiting['first_run_id']}", headers=t.headers)
    assert "max_concurrent_runs" in r.json()["wait_reason"], r.text
    r = await api.client.get("/v1/runs", params={"state": "DISPATCHED"}, headers=t.headers)
    [listed] = r.json()["items"]
    assert "max_concurrent_runs" in listed["wait_reason"]
    # The limit allows it again: the reason goes, and the run is leased.
    r = await api.client.post(
        f"/v1/attempts/{leased['attempt_id']}/complete",
        json={"fencing_token": leased["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    r = await api.client.get(f"/v1/runs/{waiting['first_run_id']}", headers=t.headers)
    assert r.json()["wait_reason"] is None
    [again] = await lease(api, worker, wid, max=5)
    assert again["run_id"] == waiting["first_run_id"]
