"""Tenants, keys and authentication."""

from __future__ import annotations

import uuid

from answers import error_of

from cronwheel.api import generate_key, hash_key
from cronwheel.store import Store


def test_generate_key_shape() -> None:
    key, key_hash, prefix = generate_key()
    assert key.startswith("cw_") and len(key) > 40
    assert key_hash == hash_key(key) and len(key_hash) == 64
    assert prefix == key[:10]
    assert generate_key()[0] != key


async def test_create_tenant_returns_an_operator_key_that_works(api, store: Store) -> None:
    r = await api.client.post(
        "/v1/tenants",
        json={"name": "billing", "limits": {"max_concurrent_runs": 5}},
        headers=api.admin,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "billing"
    assert body["limits"]["max_concurrent_runs"] == 5
    assert body["api_key"].startswith("cw_")
    assert body["key_prefix"] == body["api_key"][:10]
    # Only the hash is stored, with the operator role and the tenant.
    record = await store.api_keys_get_by_hash(key_hash=hash_key(body["api_key"]))
    assert record is not None
    assert record.role == "operator" and str(record.tenant_id) == body["id"]

    r = await api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {body['api_key']}"})
    assert r.status_code == 200, r.text
    assert r.json() == {"items": [], "next_cursor": None}


async def test_tenant_read_list_and_patch(api) -> None:
    a = await api.tenant("alpha")
    b = await api.tenant("beta")
    r = await api.client.get(f"/v1/tenants/{a.id}", headers=api.admin)
    assert r.status_code == 200 and r.json()["name"] == "alpha"
    assert "api_key" not in r.json()

    r = await api.client.get("/v1/tenants", params={"limit": 1}, headers=api.admin)
    assert r.status_code == 200
    first = r.json()
    assert len(first["items"]) == 1 and first["next_cursor"]
    r = await api.client.get(
        "/v1/tenants", params={"limit": 1, "cursor": first["next_cursor"]}, headers=api.admin
    )
    second = r.json()
    assert {first["items"][0]["id"], second["items"][0]["id"]} == {a.id, b.id}

    r = await api.client.patch(
        f"/v1/tenants/{a.id}", json={"limits": {"weight": 3}}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    assert r.json()["limits"]["weight"] == 3
    r = await api.client.patch(
        f"/v1/tenants/{a.id}", json={"limits": {"max_dispatch_rate": 10}}, headers=api.admin
    )
    limits = r.json()["limits"]
    assert limits["weight"] == 3 and limits["max_dispatch_rate"] == 10  # merged, not replaced


async def test_patch_with_bad_limits_changes_nothing(api) -> None:
    a = await api.tenant()
    r = await api.client.patch(
        f"/v1/tenants/{a.id}", json={"limits": {"weight": -1}}, headers=api.admin
    )
    assert r.status_code == 422
    assert error_of(r)["field"] == "limits.weight"
    r = await api.client.patch(
        f"/v1/tenants/{a.id}", json={"limits": {"bogus": 1}}, headers=api.admin
    )
    assert r.status_code == 422
    assert error_of(r)["field"] == "limits.bogus"
    r = await api.client.get(f"/v1/tenants/{a.id}", headers=api.admin)
    assert r.json()["limits"]["weight"] == 1.0


async def test_duplicate_tenant_name_conflicts(api) -> None:
    await api.tenant("dup")
    r = await api.client.post("/v1/tenants", json={"name": "dup"}, headers=api.admin)
    assert r.status_code == 409
    assert error_of(r)["code"] == "conflict"
    r = await api.client.get("/v1/tenants", headers=api.admin)
    assert [t["name"] for t in r.json()["items"]] == ["dup"]
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert "409" in paths["/v1/tenants"]["post"]["responses"]


async def test_bad_tenant_input(api) -> None:
    for body, field in [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "ok", "extra": 1}, "extra"),
        ({"name": "ok", "limits": {"max_concurrent_runs": 0}}, "limits.max_concurrent_runs"),
    ]:
        r = await api.client.post("/v1/tenants", json=body, headers=api.admin)
        assert r.status_code == 422, (body, r.text)
        err = error_of(r)
        assert err["code"] == "invalid_request" and err["field"] == field, err
        assert isinstance(err["message"], str) and field in err["message"]
    r = await api.client.get("/v1/tenants", headers=api.admin)
    assert r.json()["items"] == []


async def test_keys_per_role(api, store: Store) -> None:
    t = await api.tenant()
    for role in ("operator", "viewer", "worker"):
        r = await api.client.post(
            f"/v1/tenants/{t.id}/keys", json={"role": role}, headers=api.admin
        )
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["role"] == role and body["tenant_id"] == t.id
        record = await store.api_keys_get_by_hash(key_hash=hash_key(body["api_key"]))
        assert record is not None and record.role == role and record.id == uuid.UUID(body["id"])

    r = await api.client.post(f"/v1/tenants/{t.id}/keys", json={"role": "admin"}, headers=api.admin)
    assert r.status_code == 422 and error_of(r)["field"] == "role"
    r = await api.client.post(
        f"/v1/tenants/{uuid.uuid4()}/keys", json={"role": "viewer"}, headers=api.admin
    )
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


async def test_unknown_and_malformed_tenant_ids_are_404(api) -> None:
    for tid in (str(uuid.uuid4()), "not-a-uuid", "1"):
        r = await api.client.get(f"/v1/tenants/{tid}", headers=api.admin)
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"


async def test_missing_or_wrong_key_is_401(api) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Bearer cw_" + "x" * 43},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": f"Bearer {api.admin['Authorization'][7:]}x"},
    ):
        for method, path in (
            ("GET", "/v1/tenants"),
            ("POST", "/v1/jobs"),
            ("GET", "/v1/runs"),
            ("POST", "/v1/workers"),
        ):
            r = await api.client.request(method, path, json={}, headers=headers)
            assert r.status_code == 401, (headers, path, r.text)
            assert error_of(r)["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"


async def test_tenant_keys_cannot_manage_tenants(api) -> None:
    t = await api.tenant()
    for role in ("operator", "viewer", "worker"):
        headers = await api.key(t, role)
        r = await api.client.post("/v1/tenants", json={"name": f"x-{role}"}, headers=headers)
        assert r.status_code == 403, r.text
        assert error_of(r)["code"] == "forbidden"
        r = await api.client.get(f"/v1/tenants/{t.id}", headers=headers)
        assert r.status_code == 403
    r = await api.client.get("/v1/tenants", headers=api.admin)
    assert len(r.json()["items"]) == 1


async def test_admin_needs_the_tenant_header_on_tenant_resources(api) -> None:
    t = await api.tenant()
    r = await api.client.get("/v1/jobs", headers=api.admin)
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "tenant_required" and "Cronwheel-Tenant" in str(err["message"])

    for value in (str(uuid.uuid4()), "garbage"):
        r = await api.client.get("/v1/jobs", headers={**api.admin, "Cronwheel-Tenant": value})
        assert r.status_code == 404, r.text
        assert error_of(r)["field"] == "Cronwheel-Tenant"

    r = await api.client.post(
        "/v1/jobs",
        json={"name": "by-admin", "schedule": {"asap": True}, "task": "t"},
        headers={**api.admin, "Cronwheel-Tenant": t.id},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["tenant_id"] == t.id
    r = await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)
    assert r.status_code == 200
    r = await api.client.get(
        f"/v1/runs/{job['first_run_id']}", headers={**api.admin, "Cronwheel-Tenant": t.id}
    )
    assert r.status_code == 200
    assert r.json()["events"][0]["actor"] == "admin"
