"""A tenant's per-key API rate (``api_rate``, ``api_burst``), shared by every API node:
two API apps over one database together never serve a key more than its bucket holds;
a PATCH applies at once on the node that served it and within ``LIMITS_TTL`` on the
others; keys of other tenants keep the per-process limits."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from test_api_rate_limits import FrozenClock, client_of, limited

from cronwheel.api import create_app, key_rates
from cronwheel.api.key_rates import LIMITS_TTL, KeyRate, block_of
from cronwheel.metrics import API_RATE_LIMITED
from cronwheel.settings import Settings
from cronwheel.store import Store, create_store

RATE, BURST = 0.1, 4


@contextlib.asynccontextmanager
async def second_node(settings: Settings, store_url: str) -> AsyncIterator[FastAPI]:
    """Another API node: its own app over its own connections to the same database."""
    store = create_store(store_url, pool_size=2, pool_overflow=2)
    await store.open()
    try:
        app = create_app(settings, store)
        async with LifespanManager(app):
            yield app
    finally:
        await store.close()


async def limited_tenant(api: Any, **limits: Any) -> tuple[str, dict[str, str]]:
    tenant = await api.tenant()
    r = await api.client.patch(
        f"/v1/tenants/{tenant.id}", json={"limits": limits}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    return tenant.id, tenant.headers


def refusals(tenant_id: str) -> float:
    return float(API_RATE_LIMITED.labels(tenant=tenant_id)._value.get())


async def test_two_api_nodes_together_never_pass_the_bucket(
    api, settings: Settings, store: Store, store_url: str
) -> None:
    tenant_id, key = await limited_tenant(api, api_rate=RATE, api_burst=BURST)
    other_tenant = await api.tenant()
    async with second_node(settings, store_url) as node_b, client_of(node_b) as b:
        clients: list[httpx.AsyncClient] = [api.client, b]
        start = await store.db_now()
        answers = [(await clients[i % 2].get("/v1/jobs", headers=key)) for i in range(24)]
        elapsed = (await store.db_now() - start).total_seconds()
        # Another tenant's key is not held up (the per-process limits, far higher).
        for i in range(10):
            r = await clients[i % 2].get("/v1/jobs", headers=other_tenant.headers)
            assert r.status_code == 200
    served = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    # The bucket starts full: its burst is served, then it gives RATE a second. Each
    # node alone would have served its own burst and more.
    assert BURST <= len(served) <= BURST + RATE * elapsed + 1e-6
    assert {a.status_code for a in answers[:BURST]} == {200}
    for r in refused:
        error = limited(r)
        assert error["details"]["retry_after"] <= 1 / RATE + 1e-3
        assert "0.1 a second, 4 at once" in error["message"]
    assert refusals(tenant_id) == len(refused)


async def test_a_patch_applies_here_at_once_and_on_other_nodes_within_the_ttl(
    api, settings: Settings, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock()
    monkeypatch.setattr(key_rates, "_clock", clock)
    tenant_id, key = await limited_tenant(api, api_rate=0.001, api_burst=2)
    async with second_node(settings, store_url) as node_b, client_of(node_b) as b:
        for _ in range(2):
            assert (await api.client.get("/v1/jobs", headers=key)).status_code == 200
        limited(await b.get("/v1/jobs", headers=key))  # node b learns the limit
        r = await api.client.patch(
            f"/v1/tenants/{tenant_id}", json={"limits": {"api_rate": None}}, headers=api.admin
        )
        assert r.status_code == 200 and r.json()["limits"]["api_burst"] == 2
        # Without api_rate the key has the per-process limit again: at once here...
        for _ in range(5):
            assert (await api.client.get("/v1/jobs", headers=key)).status_code == 200
        # ...and on node b once its copy of the limits is LIMITS_TTL old.
        limited(await b.get("/v1/jobs", headers=key))
        clock.now += LIMITS_TTL + 0.001
        assert (await b.get("/v1/jobs", headers=key)).status_code == 200


def test_blocks_are_small_beside_the_rate_and_the_burst() -> None:
    assert block_of(KeyRate(0.1, 4)) == 1
    assert block_of(KeyRate(100.0, 200)) == 5  # a twentieth of a second
    assert block_of(KeyRate(1000.0, 8)) == 2  # at most a quarter of the burst
    assert block_of(KeyRate(5.0, 1)) == 1


async def test_a_node_claims_blocks_not_a_round_trip_per_request(
    api, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock()  # no held token expires while the test runs
    monkeypatch.setattr(key_rates, "_clock", clock)
    _tenant_id, key = await limited_tenant(api, api_rate=1000.0, api_burst=400)
    claims: list[int] = []
    real_take = store.rate_buckets_take

    async def counted(**kwargs: Any) -> Any:
        claims.append(kwargs["wanted"])
        return await real_take(**kwargs)

    monkeypatch.setattr(store, "rate_buckets_take", counted)
    for _ in range(100):
        assert (await api.client.get("/v1/jobs", headers=key)).status_code == 200
    assert claims == [50, 50]  # a twentieth of a second at 1,000 a second
    clock.now += key_rates.HOLD_SECONDS + 0.001  # what is held and unspent is dropped
    assert (await api.client.get("/v1/jobs", headers=key)).status_code == 200
    assert len(claims) == 3


async def test_the_tiniest_rate_answers_a_bounded_retry_after(api) -> None:
    _tenant_id, key = await limited_tenant(api, api_rate=5e-324, api_burst=1)
    assert (await api.client.get("/v1/jobs", headers=key)).status_code == 200
    r = await api.client.get("/v1/jobs", headers=key)
    error = limited(r)  # not a 500: the bucket's own wait is infinite
    assert error["details"]["retry_after"] == key_rates.MAX_WAIT
    assert r.headers["Retry-After"] == str(int(key_rates.MAX_WAIT))
