"""A tenant's API keys over HTTP, on both backends: listed (never the key or its hash)
and revoked — at once on the node that revokes, and on every other through the
revocation's notice, however long the key cache keeps keys — and through the CLI."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from answers import error_of
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.api import create_app
from cronwheel.cli import app as cli_app
from cronwheel.domain.audit import Actor
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store, create_store
from cronwheel.testing import wait_until_async

ADMIN_KEY = "keys-cli-admin-key"
Driver = Any  # the integration conftest's ``api`` fixture
TenantInfo = Any


@pytest.fixture
async def app(settings: Settings, store: Store) -> AsyncIterator[FastAPI]:
    # Keys are trusted for five minutes once looked up: only a revocation's notice can
    # explain a revoked key refused sooner.
    slow = settings.model_copy(update={"key_cache_ttl": 300.0})
    application = create_app(slow, store)
    async with LifespanManager(application):
        yield application


async def keys_of(api: Driver, tenant: TenantInfo, **params: Any) -> dict[str, Any]:
    r = await api.client.get(f"/v1/tenants/{tenant.id}/keys", params=params, headers=api.admin)
    assert r.status_code == 200, r.text
    page: dict[str, Any] = r.json()
    return page


async def works(api: Driver, headers: dict[str, str]) -> int:
    """The status of a read with ``headers`` (200: the key works)."""
    return (await api.client.get("/v1/jobs", headers=headers)).status_code


async def test_keys_are_listed_without_secrets(api: Driver) -> None:
    t = await api.tenant()
    viewer = await api.key(t, "viewer")
    worker = await api.key(t, "worker")
    r = await api.client.get(f"/v1/tenants/{t.id}/keys", headers=api.admin)
    assert r.status_code == 200, r.text
    for secret in (t.key, viewer["Authorization"][7:], worker["Authorization"][7:]):
        assert secret not in r.text
    page = r.json()
    assert [k["role"] for k in page["items"]] == ["operator", "viewer", "worker"]
    assert page["next_cursor"] is None
    for key in page["items"]:
        assert set(key) == {"id", "tenant_id", "role", "prefix", "created_at", "revoked_at"}
        assert key["tenant_id"] == t.id and key["revoked_at"] is None
    assert page["items"][0]["prefix"] == t.key[:10]

    first = await keys_of(api, t, limit=2)
    assert len(first["items"]) == 2 and first["next_cursor"] is not None
    rest = await keys_of(api, t, cursor=first["next_cursor"])
    assert [k["id"] for k in first["items"] + rest["items"]] == [k["id"] for k in page["items"]]

    # Another tenant's keys are not among them.
    other = await api.tenant()
    assert [k["role"] for k in (await keys_of(api, other))["items"]] == ["operator"]


async def test_only_the_admin_lists_and_revokes(api: Driver) -> None:
    t = await api.tenant()
    [key] = (await keys_of(api, t))["items"]
    for headers in (t.headers, await api.key(t, "worker")):
        r = await api.client.get(f"/v1/tenants/{t.id}/keys", headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
        r = await api.client.delete(f"/v1/tenants/{t.id}/keys/{key['id']}", headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    assert await works(api, t.headers) == 200


async def test_a_revoked_key_is_refused_at_once_and_audited(api: Driver) -> None:
    t = await api.tenant()
    viewer = await api.key(t, "viewer")
    assert await works(api, viewer) == 200  # now cached, for five minutes
    [_operator, listed] = (await keys_of(api, t))["items"]

    r = await api.client.delete(
        f"/v1/tenants/{t.id}/keys/{listed['id']}",
        params={"reason": "left the team"},
        headers=api.admin,
    )
    assert r.status_code == 200, r.text
    revoked = r.json()
    assert revoked["id"] == listed["id"] and revoked["revoked_at"] is not None
    r = await api.client.get("/v1/jobs", headers=viewer)
    assert r.status_code == 401 and error_of(r)["code"] == "unauthorized"
    assert await works(api, t.headers) == 200  # the tenant's other keys go on

    [_, again] = (await keys_of(api, t))["items"]
    assert again["revoked_at"] == revoked["revoked_at"]
    # Revoking it again changes nothing.
    r = await api.client.delete(f"/v1/tenants/{t.id}/keys/{listed['id']}", headers=api.admin)
    assert r.status_code == 200 and r.json()["revoked_at"] == revoked["revoked_at"]

    events = (await api.store.events_list(uuid.UUID(t.id))).items
    [event] = [e for e in events if e.kind == "api_key.revoked"]
    assert (event.actor, event.reason) == ("admin", "left the team")
    assert event.data == {"key_id": listed["id"], "role": "viewer", "prefix": listed["prefix"]}


async def test_another_tenants_key_and_bad_ids_change_nothing(api: Driver) -> None:
    mine, other = await api.tenant(), await api.tenant()
    [others_key] = (await keys_of(api, other))["items"]
    before = await api.snapshot(other)
    cases = [
        (f"/v1/tenants/{mine.id}/keys/{others_key['id']}", {}, 404, None),
        (f"/v1/tenants/{mine.id}/keys/{uuid.uuid4()}", {}, 404, None),
        (f"/v1/tenants/{mine.id}/keys/not-a-key", {}, 404, None),
        (f"/v1/tenants/{uuid.uuid4()}/keys/{others_key['id']}", {}, 404, None),
        (f"/v1/tenants/nope/keys/{others_key['id']}", {}, 404, None),
        (f"/v1/tenants/{other.id}/keys/{others_key['id']}", {"reason": "x" * 1001}, 422, "reason"),
        (f"/v1/tenants/{other.id}/keys/{others_key['id']}", {"reason": "a\x00b"}, 422, "reason"),
    ]
    for path, params, status, field in cases:
        r = await api.client.delete(path, params=params, headers=api.admin)
        assert r.status_code == status, (path, r.text)
        err = error_of(r)
        assert err["field"] == field if field else err["code"] == "not_found"
    for path, params in [
        (f"/v1/tenants/{uuid.uuid4()}/keys", {}),
        ("/v1/tenants/nope/keys", {}),
    ]:
        r = await api.client.get(path, params=params, headers=api.admin)
        assert r.status_code == 404 and error_of(r)["code"] == "not_found", r.text
    for params, field in [({"limit": 0}, "limit"), ({"cursor": "garbage"}, "cursor")]:
        r = await api.client.get(f"/v1/tenants/{other.id}/keys", params=params, headers=api.admin)
        assert r.status_code == 422 and error_of(r)["field"] == field, r.text

    assert await works(api, other.headers) == 200
    assert [k["revoked_at"] for k in (await keys_of(api, other))["items"]] == [None]
    assert await api.snapshot(other) == before


async def test_a_key_revoked_by_another_node_is_refused_here_at_once(
    api: Driver, store_url: str
) -> None:
    """Another API process (its own store on the same database) revokes a key this one
    has cached for five minutes: its notice makes this one refuse the key at once
    (PostgreSQL: LISTEN/NOTIFY; SQLite has one process, where it is delivered in
    process)."""
    t = await api.tenant()
    viewer = await api.key(t, "viewer")
    assert await works(api, viewer) == 200
    [_operator, key] = (await keys_of(api, t))["items"]
    elsewhere = create_store(store_url) if api.store.dialect == "postgresql" else api.store
    await elsewhere.open()
    try:
        await elsewhere.api_keys_revoke(uuid.UUID(t.id), uuid.UUID(key["id"]), actor=Actor("admin"))
    finally:
        if elsewhere is not api.store:
            await elsewhere.close()

    async def refused() -> bool:
        return await works(api, viewer) == 401

    await wait_until_async(refused, 5.0, what="the revoked key to be refused", interval=0.05)


# -- the CLI -------------------------------------------------------------------------


@pytest.fixture
def running(store_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings, scheduler=False)) as server,
        Client(server.url, api_key=ADMIN_KEY) as admin,
    ):
        yield server.url, admin.tenants.create(f"cli-keys-{uuid.uuid4().hex[:6]}")


def cli(url: str, *args: str) -> Any:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": ADMIN_KEY, "COLUMNS": "200"}
    return CliRunner().invoke(cli_app, list(args), env=env)


def test_cli_lists_and_revokes_keys(running: tuple[str, dict[str, Any]]) -> None:
    url, tenant = running
    listed = cli(url, "tenants", "keys", "list", tenant["id"])
    assert listed.exit_code == 0, listed.output
    assert "keys (1)" in listed.stdout and tenant["key_id"] in listed.stdout
    assert "operator" in listed.stdout and tenant["key_prefix"] in listed.stdout
    assert tenant["api_key"] not in listed.stdout

    revoked = cli(url, "tenants", "keys", "revoke", tenant["id"], tenant["key_id"], "--reason", "r")
    assert revoked.exit_code == 0, revoked.output
    assert f"revoked operator key {tenant['key_id']}" in revoked.stdout
    with httpx.Client(base_url=url) as client:
        r = client.get("/v1/jobs", headers={"Authorization": f"Bearer {tenant['api_key']}"})
        assert r.status_code == 401

    as_json = cli(url, "tenants", "keys", "list", tenant["id"], "--json")
    assert as_json.exit_code == 0, as_json.output
    assert '"revoked_at": null' not in as_json.stdout

    unknown = cli(url, "tenants", "keys", "revoke", tenant["id"], str(uuid.uuid4()))
    assert unknown.exit_code != 0 and "not found" in unknown.output
    bad = cli(url, "tenants", "keys", "list", "nope")
    assert bad.exit_code != 0 and "no tenant" in bad.output
