"""Request rate limits: a token bucket per API key (worker keys and the admin key far
higher), per client address without a valid key; 429 ``rate_limited`` with
``Retry-After`` and the JSON error body; the probes never limited."""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from cronwheel import AsyncClient
from cronwheel.api import create_app, rate_limits
from cronwheel.api.auth import KeyCache, hash_key
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext, Worker

ADMIN = {"Authorization": "Bearer test-admin-key-0123456789"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Tight limits, so a test reaches them in a few requests."""
    return settings.model_copy(
        update={
            "rate_limit": 2.0,
            "rate_limit_burst": 3,
            "worker_rate_limit": 1000.0,
            "worker_rate_limit_burst": 50,
            "anonymous_rate_limit": 1.0,
            "anonymous_rate_limit_burst": 4,
        }
    )


class FrozenClock:
    """The buckets' clock, moved on by the test alone: no refill while a test runs
    unless it says so, however slow the machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    frozen = FrozenClock()
    monkeypatch.setattr(rate_limits, "_clock", frozen)
    return frozen


@contextlib.asynccontextmanager
async def client_of(app: FastAPI, address: str = "127.0.0.1") -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://cw") as client:
        yield client


def limited(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == "rate_limited"
    retry_after = error["details"]["retry_after"]
    assert retry_after > 0
    assert int(r.headers["Retry-After"]) == max(1, math.ceil(retry_after))
    return error


async def tenant_keys(api: Any) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    t = await api.tenant()
    return t.headers, await api.key(t, "viewer"), await api.key(t, "worker")


async def test_each_key_has_its_own_bucket(api, store: Store, clock: FrozenClock) -> None:
    t = await api.tenant()
    operator, viewer = t.headers, await api.key(t, "viewer")
    other, _, _ = await tenant_keys(api)
    for _ in range(3):
        assert (await api.client.get("/v1/jobs", headers=operator)).status_code == 200
    error = limited(await api.client.get("/v1/jobs", headers=operator))
    assert "with this API key" in error["message"]
    # Writes are refused before anything is done.
    r = await api.client.post(
        "/v1/jobs",
        json={"name": "x", "schedule": {"asap": True}, "task": "t"},
        headers=operator,
    )
    limited(r)
    assert (await store.jobs_list(uuid.UUID(t.id))).items == []
    # Other keys, of the same tenant or another, are not held up.
    assert (await api.client.get("/v1/jobs", headers=viewer)).status_code == 200
    assert (await api.client.get("/v1/jobs", headers=other)).status_code == 200
    # The bucket refills at its rate (2 a second): the key works again after
    # Retry-After, once, then waits again.
    wait = limited(await api.client.get("/v1/jobs", headers=operator))["details"]["retry_after"]
    assert wait == pytest.approx(0.5)
    clock.now += wait
    assert (await api.client.get("/v1/jobs", headers=operator)).status_code == 200
    limited(await api.client.get("/v1/jobs", headers=operator))


async def test_worker_keys_and_the_admin_key_have_a_higher_limit(api, clock: FrozenClock) -> None:
    operator, _, worker = await tenant_keys(api)
    for _ in range(3):
        await api.client.get("/v1/jobs", headers=operator)
    limited(await api.client.get("/v1/jobs", headers=operator))
    wid = (await api.client.post("/v1/workers", json={}, headers=worker)).json()["worker_id"]
    for _ in range(40):  # far past the other keys' burst
        r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=worker)
        assert r.status_code == 200, r.text
    for _ in range(20):
        assert (await api.client.get("/v1/tenants", headers=ADMIN)).status_code == 200


async def test_requests_without_a_valid_key_are_limited_per_address(
    api, app: FastAPI, store: Store, monkeypatch: pytest.MonkeyPatch, clock: FrozenClock
) -> None:
    operator, _, _ = await tenant_keys(api)
    await api.client.get("/v1/jobs", headers=operator)  # a key at work before the flood
    lookups: list[str] = []
    real_lookup = store.api_keys_get_by_hash

    async def counted(*, key_hash: str) -> Any:
        lookups.append(key_hash)
        return await real_lookup(key_hash=key_hash)

    monkeypatch.setattr(store, "api_keys_get_by_hash", counted)
    async with client_of(app, "10.1.1.1") as guesser, client_of(app, "10.2.2.2") as neighbour:
        made_up = [{"Authorization": f"Bearer cw_{uuid.uuid4().hex}"} for _ in range(10)]
        answers = [(await guesser.get("/v1/jobs", headers=h)).status_code for h in made_up]
        assert answers[:4] == [401] * 4  # the burst, then the address is held up
        assert answers[4:] == [429] * 6
        assert len(lookups) == 4  # refused keys never reach the store
        error = limited(await guesser.get("/v1/jobs"))  # no key at all: the same bucket
        assert "without a valid API key" in error["message"]
        limited(await guesser.get("/openapi.json"))
        # The probes are never limited.
        for _ in range(50):
            assert (await guesser.get("/healthz")).status_code == 200
            assert (await guesser.get("/readyz")).status_code == 200
        # A key already at work is not held up by its address's flood.
        assert (await guesser.get("/v1/jobs", headers=operator)).status_code == 200
        # Another address has its own bucket.
        assert (await neighbour.get("/v1/jobs", headers=made_up[0])).status_code == 401


async def test_a_new_valid_key_is_not_charged_to_its_address(
    api, app: FastAPI, clock: FrozenClock
) -> None:
    async with client_of(app, "10.3.3.3") as client:
        keys = [(await tenant_keys(api))[0] for _ in range(6)]
        # Six keys this process has not seen, more than the address's burst of four:
        # each is looked up and found valid, and its charge goes back to the address.
        for headers in keys:
            assert (await client.get("/v1/jobs", headers=headers)).status_code == 200
        for _ in range(4):
            assert (await client.get("/v1/jobs")).status_code == 401
        limited(await client.get("/v1/jobs"))


async def test_limits_are_off_at_zero(settings: Settings, store: Store) -> None:
    off = settings.model_copy(update={"rate_limit": 0.0, "anonymous_rate_limit": 0.0})
    app = create_app(off, store)
    async with LifespanManager(app), client_of(app) as client:
        for _ in range(30):
            assert (await client.get("/v1/jobs")).status_code == 401


def test_defaults_are_generous_and_the_workers_higher() -> None:
    s = Settings()
    assert s.rate_limit >= 100 and s.rate_limit_burst >= 200
    assert s.worker_rate_limit >= 10 * s.rate_limit
    assert s.worker_rate_limit_burst >= 10 * s.rate_limit_burst
    assert 0 < s.anonymous_rate_limit < s.rate_limit


async def test_429_is_documented(api) -> None:
    paths = (await api.client.get("/openapi.json", headers=ADMIN)).json()["paths"]
    op = paths["/v1/jobs"]["get"]
    assert op["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse"
    )


async def test_the_key_cache_remembers_valid_keys_for_rate_limits_only(api, store: Store) -> None:
    """Past its expiry a valid key stays known to ``peek(stale_for=…)`` — the rate
    limiter's question, who had a key — while authentication looks it up again."""
    t = await api.tenant()
    valid = hash_key(t.key)
    made_up = hash_key(f"cw_{uuid.uuid4().hex}")
    cache = KeyCache(store, ttl=1.0)  # long enough to outlast one lookup on a busy machine
    assert cache.peek(valid) == (False, None)
    record = await cache.lookup(valid)
    assert record is not None and cache.peek(valid) == (True, record)
    assert await cache.lookup(made_up) is None
    assert cache.peek(made_up) == (True, None)  # known to be no key, for a moment

    await wait_until_async(  # both entries expire
        lambda: not (cache.peek(valid)[0] or cache.peek(made_up)[0]), 5, what="expiry"
    )
    assert cache.peek(valid, stale_for=600) == (True, record)
    assert cache.peek(made_up, stale_for=600) == (False, None)


async def test_a_rate_limited_worker_reports_its_outcomes_later(
    settings: Settings, store: Store
) -> None:
    """429 is not a refusal of a batch report: the SDK keeps the outcomes and sends them
    again after a pause — never drops them, never turns a result into a failure."""
    inner = create_app(settings, store)
    refused: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        # The first two reports are answered as a rate-limited server would.
        if scope["type"] == "http" and scope["path"] == "/v1/attempts/batch" and len(refused) < 2:
            refused.append(scope["path"])
            body = b'{"error": {"code": "rate_limited", "message": "slow down"}}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    async with (
        serving(app) as url,
        AsyncClient(url, api_key=ADMIN["Authorization"].split()[1]) as admin,
    ):
        tenant = await admin.tenants.create(f"rl-{uuid.uuid4().hex[:6]}")
        key = (await admin.tenants.create_key(tenant["id"], role="worker"))["api_key"]
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            job = await operator.jobs.create(name="j", schedule={"asap": True}, task="work")
            fired = await fire_all(store)
            assert fired == 1
            worker = Worker(url, api_key=key, lease_wait=0.2)

            @worker.task("work")
            async def work(ctx: TaskContext, payload: dict[str, Any]) -> str:
                return "done"

            async with asyncio.timeout(30):
                await worker.run_async(drain=True)
            run = await operator.runs.get(job["first_run_id"])
    assert len(refused) == 2
    assert run["state"] == "SUCCESS" and run["result"] == "done", run
    assert [a["state"] for a in run["attempts"]] == ["SUCCEEDED"]
    assert worker.stats.succeeded == 1 and worker.stats.failed == 0


async def fire_all(store: Store) -> int:
    shards = range(256)
    await store.shard_leases_acquire(node_id="t", shards=shards, ttl=60)
    now = await store.db_now()
    due = await store.runs_due_scan(shards=shards, until=now + timedelta(seconds=1))
    return len(await store.runs_fire(run_ids=[d.id for d in due], node_id="t"))
