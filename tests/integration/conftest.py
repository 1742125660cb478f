"""API fixtures: the real app over the real store (both backends), driven in-process
through httpx's ASGI transport, with its lifespan run by asgi-lifespan."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from asgi_lifespan import LifespanManager
from cli_server import CLI_ADMIN_KEY, Server
from fastapi import FastAPI
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.api import create_app
from cronwheel.domain.model import FiredRun
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store

ADMIN_KEY = "test-admin-key-0123456789"
ALL_SHARDS = range(256)
MAX_PAYLOAD = 4096


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class TenantInfo:
    id: str
    name: str
    key: str  # the operator key made with the tenant

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.key)


class Driver:
    """Short-hands for the steps every API test repeats."""

    def __init__(self, client: httpx.AsyncClient, store: Store, app: FastAPI) -> None:
        self.client = client
        self.store = store
        self.app = app
        self.admin = bearer(ADMIN_KEY)

    async def tenant(self, name: str | None = None) -> TenantInfo:
        name = name or f"team-{uuid.uuid4().hex[:8]}"
        r = await self.client.post("/v1/tenants", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        body = r.json()
        return TenantInfo(id=body["id"], name=name, key=body["api_key"])

    async def key(self, tenant: TenantInfo, role: str) -> dict[str, str]:
        r = await self.client.post(
            f"/v1/tenants/{tenant.id}/keys", json={"role": role}, headers=self.admin
        )
        assert r.status_code == 201, r.text
        return bearer(r.json()["api_key"])

    async def job(self, tenant: TenantInfo, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"name": "job", "schedule": {"asap": True}, "task": "t.run"}
        body.update(fields)
        r = await self.client.post("/v1/jobs", json=body, headers=tenant.headers)
        assert r.status_code == 201, r.text
        result: dict[str, Any] = r.json()
        return result

    async def fire(self) -> list[FiredRun]:
        """Dispatch every run due by now, as a scheduler owning every shard would."""
        await self.store.shard_leases_acquire(node_id="t", shards=ALL_SHARDS, ttl=60)
        now = await self.store.db_now()
        due = await self.store.runs_due_scan(shards=ALL_SHARDS, until=now + timedelta(seconds=1))
        return await self.store.runs_fire(run_ids=[d.id for d in due], node_id="t")

    async def snapshot(self, tenant: TenantInfo) -> tuple[list[Any], ...]:
        """Everything of the tenant's that a write could touch, to prove nothing changed."""
        tid = uuid.UUID(tenant.id)
        jobs = await self.store.jobs_list(tid, limit=1000)
        runs = await self.store.runs_list(tid, limit=1000)
        events = await self.store.events_list(tid, limit=1000)
        return jobs.items, runs.items, [e.id for e in events.items]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        admin_key=ADMIN_KEY,
        max_payload_bytes=MAX_PAYLOAD,
        lease_wait_max=10.0,
        heartbeat_interval=5.0,
    )


@pytest.fixture
async def app(settings: Settings, store: Store) -> AsyncIterator[FastAPI]:
    application = create_app(settings, store)
    async with LifespanManager(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cronwheel.test") as c:
        yield c


@pytest.fixture
def api(client: httpx.AsyncClient, store: Store, app: FastAPI) -> Driver:
    return Driver(client, store, app)


@pytest.fixture
def only_loopback_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tripwire under every HTTP client of a test (the webhook tests use it): no
    connection ever leaves this machine, even should the webhook worker's own guard
    fail (the test fails instead)."""
    real = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(self: Any, host: str, port: int, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"tripwire: a connection to {host} was attempted")
        return await real(self, host, port, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)


@pytest.fixture
def live(store_url: str, tmp_path: Path) -> Iterator[tuple[str, Client, str]]:
    """A server (API + scheduler), a tenant's operator client and a worker key."""
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key="adm")
    with BackgroundRuntime(Runtime(settings)) as server, Client(server.url, api_key="adm") as admin:
        tenant = admin.tenants.create(f"w-{uuid.uuid4().hex[:6]}")
        worker_key = admin.tenants.create_key(tenant["id"], role="worker")["api_key"]
        with Client(server.url, api_key=tenant["api_key"]) as operator:
            yield server.url, operator, worker_key


# -- the CLI against a real server ----------------------------------------------------


@pytest.fixture
def cli_server(store_url: str, tmp_path: Path) -> Iterator[Server]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=CLI_ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings)) as running,
        Client(running.url, api_key=CLI_ADMIN_KEY) as admin,
    ):
        tenant = admin.tenants.create(f"cli-{uuid.uuid4().hex[:6]}")
        yield Server(running.url, tenant["api_key"], tenant["id"], CliRunner())
