"""``GET /v1/overview`` and the client's ``overview``: a tenant's key sees its own runs
only, the admin key every tenant's (or one tenant's with ``Cronwheel-Tenant``), the
alerts and pools are those of their own routes, and a bad window is refused; on both
backends."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from cronwheel import Client
from cronwheel.api.overview import overview_for
from cronwheel.client.aio import AsyncClient
from cronwheel.store import Store

ALL_SHARDS = list(range(256))


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def overview(api: Any, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    r = await api.client.get("/v1/overview", params=params, headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def dispatched(body: dict[str, Any]) -> int:
    return int(body["total"]["states"]["DISPATCHED"])


async def test_each_key_sees_its_own_runs_and_the_admin_every_tenants(api: Any) -> None:
    one, two = await api.tenant(), await api.tenant()
    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    for _ in range(3):
        await api.job(one, pool=pool, requires=["cuda"])
    await api.job(two, pool=pool, requires=["cuda"])
    await api.fire()
    await api.store.runs_route_check(shards=ALL_SHARDS, min_wait=0.0, worker_ttl=30.0)

    mine = await overview(api, one.headers)
    assert (mine["total"]["runs"], dispatched(mine)) == (3, 3)
    assert sum(m["states"]["DISPATCHED"] for m in mine["minutes"]) == 3
    assert len(mine["minutes"]) == 60
    assert mine["total"]["success_rate"] is None  # nothing has run yet
    # Dispatched by the test as soon as created: a lateness, and no start yet.
    assert mine["total"]["dispatch_lateness_p50_ms"] >= 0
    assert mine["total"]["start_lateness_p50_ms"] is None
    theirs = await overview(api, two.headers)
    assert (theirs["total"]["runs"], dispatched(theirs)) == (1, 1)
    viewer = await overview(api, await api.key(one, "viewer"))
    assert dispatched(viewer) == 3

    every = await overview(api, api.admin)
    assert dispatched(every) == 4
    named = await overview(api, {**api.admin, "Cronwheel-Tenant": two.id})
    assert dispatched(named) == 1

    # The alerts and the pools are those their own routes answer, key by key.
    for headers in (one.headers, two.headers, api.admin):
        body = await overview(api, headers)
        alerts = (await api.client.get("/v1/alerts", headers=headers)).json()["items"]
        pools = (await api.client.get("/v1/pools", headers=headers)).json()["items"]
        assert body["alerts"] == alerts
        assert body["pools"] == pools
    [alert] = mine["alerts"]
    assert (alert["tenant_id"], alert["runs"]) == (one.id, 3)
    [p] = [p for p in mine["pools"] if p["name"] == pool]
    assert (p["ready"], p["free"]) == (3, None)
    [p] = [p for p in every["pools"] if p["name"] == pool]
    assert (p["ready"], p["free"]) == (4, 0)

    unknown = await api.client.get(
        "/v1/overview", headers={**api.admin, "Cronwheel-Tenant": str(uuid.uuid4())}
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["field"] == "Cronwheel-Tenant"
    worker = await api.client.get("/v1/overview", headers=await api.key(one, "worker"))
    assert worker.status_code == 403
    assert (await api.client.get("/v1/overview")).status_code == 401


async def test_the_window_is_the_last_minutes_up_to_now(api: Any) -> None:
    t = await api.tenant()
    body = await overview(api, t.headers, minutes=5)
    now, since = parse(body["now"]), parse(body["since"])
    assert [parse(m["at"]) for m in body["minutes"]] == [
        since + timedelta(minutes=i) for i in range(5)
    ]
    assert since == now.replace(second=0, microsecond=0) - timedelta(minutes=4)
    assert body["total"]["runs"] == 0
    assert len((await overview(api, t.headers, minutes=1440))["minutes"]) == 1440


@pytest.mark.parametrize("minutes", ["0", "-5", "1441", "sixty", "1.5", ""])
async def test_a_bad_window_is_refused(api: Any, minutes: str) -> None:
    t = await api.tenant()
    r = await api.client.get("/v1/overview", params={"minutes": minutes}, headers=t.headers)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    assert r.json()["error"]["field"] == "minutes"


async def test_overview_for_reads_the_window_given(api: Any, store: Store) -> None:
    one, two = await api.tenant(), await api.tenant()
    await api.job(one)
    await api.job(two)
    await api.fire()
    now = await store.db_now()
    got = await overview_for(store, uuid.UUID(one.id), minutes=2, now=now)
    assert got.total.states["DISPATCHED"] == 1 and got.total.runs == 1
    every = await overview_for(store, None, minutes=2, now=now)
    assert every.total.states["DISPATCHED"] == 2
    # An hour later the runs are out of a ten-minute window.
    later = await overview_for(store, None, minutes=10, now=now + timedelta(hours=1))
    assert later.total.runs == 0


def test_the_clients_read_the_overview(live: tuple[str, Client, str]) -> None:
    url, operator, _worker_key = live
    operator.jobs.create(name="x", schedule={"asap": True}, task="t")
    body = operator.overview(minutes=3)
    assert len(body["minutes"]) == 3 and body["total"]["runs"] == 1

    async def read() -> dict[str, Any]:
        async with AsyncClient(url, api_key=operator.api_key) as client:
            got: dict[str, Any] = await client.overview()
        return got

    body = asyncio.run(read())
    assert len(body["minutes"]) == 60 and body["total"]["runs"] == 1
