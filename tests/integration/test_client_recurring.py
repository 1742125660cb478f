"""``client.jobs.pause/resume/trigger/backfill/preview`` on both clients: the async one
in-process over the real app, the blocking one against a real server; both backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from cronwheel import ApiError, AsyncClient, Client
from cronwheel.api import create_app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.timing import local_form, occurrences

ADMIN_KEY = "client-recurring-admin-key"
BASE = "http://cronwheel.test"
NIGHTLY = {"cron": "30 1 * * *", "timezone": "Europe/Paris", "on_ambiguous": "all"}


@pytest.fixture
async def app(store: Store, tmp_path: Path) -> AsyncIterator[FastAPI]:
    application = create_app(Settings(data_dir=tmp_path, admin_key=ADMIN_KEY), store)
    async with LifespanManager(application):
        yield application


@pytest.fixture
async def operator(app: FastAPI) -> AsyncIterator[AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(BASE, api_key=ADMIN_KEY, transport=transport) as admin:
        tenant = await admin.tenants.create(f"team-{uuid.uuid4().hex[:6]}")
    async with AsyncClient(BASE, api_key=tenant["api_key"], transport=transport) as client:
        yield client


async def test_async_control_of_a_recurring_job(operator: AsyncClient) -> None:
    job = await operator.jobs.create(
        name="nightly", schedule=NIGHTLY, task="report", payload={"region": "eu"}
    )
    assert job["schedule"]["cron"] == "30 1 * * *" and job["state"] == "active"

    paused = await operator.jobs.pause(job["id"], reason="holiday")
    assert paused["state"] == "paused"
    with pytest.raises(ApiError) as info:
        await operator.jobs.pause(job["id"])
    assert (info.value.status, info.value.code) == (409, "illegal_transition")
    assert (await operator.jobs.resume(job["id"]))["state"] == "active"

    run = await operator.jobs.trigger(job["id"], payload={"region": "us", "dry": True})
    assert run["origin"] == "trigger" and run["payload"] == {"region": "us", "dry": True}
    plain = await operator.jobs.trigger(job["id"])
    assert plain["payload"] == {"region": "eu"}

    now = datetime.now(UTC)
    start, end = now - timedelta(days=3), now - timedelta(minutes=1)
    made = await operator.jobs.backfill(job["id"], start=start, end=end, rate=50)
    expected = occurrences("30 1 * * *", "Europe/Paris", start, end, on_ambiguous="all")
    assert made["created"] == len(made["runs"]) == len(expected) >= 2
    again = await operator.jobs.backfill(job["id"], start=start, end=end)
    assert again == {"created": 0, "runs": []}
    with pytest.raises(ApiError) as info:
        await operator.jobs.backfill(job["id"], start=end, end=start)
    assert (info.value.status, info.value.field) == (422, "to")

    items = await operator.jobs.preview(job["id"], count=3)
    assert len(items) == 3
    for item in items:
        due = datetime.fromisoformat(item["due_at"])
        assert item["due_at"].endswith("Z")
        assert item["due_local"] == local_form(due, "Europe/Paris")
    assert len(await operator.jobs.preview(job["id"])) == 10

    with pytest.raises(ApiError) as info:
        await operator.jobs.preview(job["id"], count=0)
    assert (info.value.status, info.value.field) == (422, "count")
    with pytest.raises(ApiError) as info:
        await operator.jobs.trigger(str(uuid.uuid4()))
    assert info.value.status == 404


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[BackgroundRuntime]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with BackgroundRuntime(Runtime(settings, scheduler=False)) as running:
        yield running


def test_blocking_control_of_a_recurring_job(server: BackgroundRuntime) -> None:
    with Client(server.url, api_key=ADMIN_KEY) as admin:
        tenant = admin.tenants.create("blocking-recurring")
    with Client(server.url, api_key=tenant["api_key"]) as client:
        job = client.jobs.create(name="every", schedule={"interval": 60}, task="t")
        assert client.jobs.pause(job["id"])["state"] == "paused"
        assert client.jobs.resume(job["id"], reason="back")["state"] == "active"
        run: dict[str, Any] = client.jobs.trigger(job["id"], payload={"n": 1})
        assert (run["origin"], run["payload"]) == ("trigger", {"n": 1})

        now = datetime.now(UTC)
        made = client.jobs.backfill(
            job["id"], start=now - timedelta(minutes=10), end=now - timedelta(seconds=1)
        )
        assert 9 <= made["created"] <= 10
        runs = {r["id"]: r for r in client.runs.iter(job_id=job["id"])}
        assert {runs[i]["origin"] for i in made["runs"]} == {"backfill"}

        items = client.jobs.preview(job["id"], count=2)
        first, second = (datetime.fromisoformat(i["due_at"]) for i in items)
        assert second - first == timedelta(seconds=60)

        client.jobs.cancel(job["id"])
        assert client.jobs.preview(job["id"]) == []
        with pytest.raises(ApiError) as info:
            client.jobs.trigger(job["id"])
        assert (info.value.status, info.value.code) == (409, "illegal_transition")
