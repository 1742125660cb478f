"""``max_pending_runs`` through the API: every route that adds runs answers 429
``limit_exceeded`` naming the limit, the count and the limit, stores nothing, and
counts each refusal in ``cronwheel_runs_throttled``; every tenant limit is set by
PATCH and shown by GET."""

from __future__ import annotations

from typing import Any

from answers import error_of

from cronwheel.metrics import RUNS_THROTTLED

LATER = {"delay": 86400}
HOURLY = {"cron": "0 * * * *", "timezone": "UTC"}


def limit_refusal(r: Any, *, pending: int, adding: int, limit: int) -> None:
    assert r.status_code == 429, r.text
    error = error_of(r)
    assert error["code"] == "limit_exceeded"
    assert error["details"]["limit"] == "max_pending_runs"
    assert error["details"]["pending"] == pending
    assert error["details"]["adding"] == adding
    assert error["details"]["max"] == limit
    assert "Retry-After" not in r.headers


def throttled(tenant_name: str) -> float:
    value = RUNS_THROTTLED.labels(tenant=tenant_name, limit="max_pending_runs")._value.get()
    return float(value)


async def test_creates_past_the_limit_are_refused_and_change_nothing(api) -> None:
    tenant = await api.tenant()
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": {"max_pending_runs": 2}}, headers=api.admin
    )
    assert r.status_code == 200 and r.json()["limits"]["max_pending_runs"] == 2
    job = await api.job(tenant, schedule=HOURLY)
    before = await api.snapshot(tenant)

    batch = {"jobs": [{"name": f"b{i}", "schedule": LATER, "task": "t.run"} for i in range(2)]}
    r = await api.client.post("/v1/jobs/batch", json=batch, headers=tenant.headers)
    limit_refusal(r, pending=1, adding=2, limit=2)
    assert "max_pending_runs" in error_of(r)["message"]
    assert await api.snapshot(tenant) == before
    assert throttled(tenant.name) == 1  # once per refused request

    r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=tenant.headers)
    assert r.status_code == 201, r.text
    r = await api.client.post(f"/v1/jobs/{job['id']}/trigger", headers=tenant.headers)
    limit_refusal(r, pending=2, adding=1, limit=2)
    r = await api.client.post(
        "/v1/jobs", json={"name": "one", "schedule": LATER, "task": "t.run"}, headers=tenant.headers
    )
    limit_refusal(r, pending=2, adding=1, limit=2)
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/backfill",
        json={"from": "2020-01-01T00:00:00Z", "to": "2020-01-01T03:00:00Z"},
        headers=tenant.headers,
    )
    limit_refusal(r, pending=2, adding=3, limit=2)
    assert throttled(tenant.name) == 4

    # Another tenant is not touched by this one's limit.
    other = await api.tenant()
    for _ in range(3):
        await api.job(other, schedule=LATER)
    # Raising the limit lets creates through again.
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": {"max_pending_runs": 3}}, headers=api.admin
    )
    assert r.status_code == 200
    await api.job(tenant, schedule=LATER)


async def test_every_limit_is_set_by_patch_and_shown_by_get(api) -> None:
    tenant = await api.tenant()
    limits = {
        "max_concurrent_runs": 5,
        "max_dispatch_rate": 2.5,
        "dispatch_burst": 10,
        "max_pending_runs": 1000,
        "api_rate": 20.0,
        "api_burst": 40,
        "weight": 3.0,
    }
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": limits}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    r = await api.client.get(f"/v1/tenants/{tenant.id}", headers=api.admin)
    assert r.json()["limits"] == limits
    # Null clears a limit; the others keep their values.
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": {"api_rate": None}}, headers=api.admin
    )
    assert r.json()["limits"] == {**limits, "api_rate": None}


async def test_bad_limits_are_422_and_change_nothing(api) -> None:
    tenant = await api.tenant()
    for field, value in [
        ("max_pending_runs", 0),
        ("max_pending_runs", 1.5),
        ("api_rate", 0),
        ("api_rate", -2),
        ("api_burst", 0),
        ("dispatch_burst", 0),
        ("max_dispatch_rate", 0),
        ("max_concurrent_runs", 0),
        ("weight", 0),
    ]:
        r = await api.client.patch(
            f"/v1/tenants/{tenant.id}", json={"limits": {field: value}}, headers=api.admin
        )
        assert r.status_code == 422, (field, value, r.text)
        assert error_of(r)["field"] == f"limits.{field}"
    r = await api.client.get(f"/v1/tenants/{tenant.id}", headers=api.admin)
    assert r.json()["limits"]["max_pending_runs"] is None
    assert r.json()["limits"]["weight"] == 1.0


async def test_the_openapi_schema_names_the_refusal(api) -> None:
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    for path in ("/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{job_id}/trigger"):
        assert "limit_exceeded" in paths[path]["post"]["responses"]["429"]["description"]


async def test_clearing_the_weight_is_422(api) -> None:
    tenant = await api.tenant()
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": {"weight": None}}, headers=api.admin
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["field"] == "limits.weight"
