"""``/v1/pools``: each pool's live capacity and backlog (the admin sees every tenant's,
a tenant's key only its own), the P0 share an admin sets (audited), the gauges at
``/metrics``; on both backends."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from answers import error_of

from cronwheel.settings import Settings

LISTED = "gpu-listed"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"metrics_pools": ["default", LISTED]})


async def _register(api: Any, headers: dict[str, str], **body: Any) -> str:
    r = await api.client.post("/v1/workers", json=body, headers=headers)
    assert r.status_code == 200, r.text
    worker_id: str = r.json()["worker_id"]
    return worker_id


def _by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in body["items"]}


def _backlog(pool: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(b["tenant"], b["priority_class"]): (b["ready"], b["due"]) for b in pool["backlog"]}


async def _scene(api: Any) -> tuple[Any, Any]:
    """Alpha floods the default pool at P2; beta has two P0 runs there and one in a
    pool of its own; a shared worker of capacity 10 serves both, beta has its own."""
    alpha, beta = await api.tenant(f"alpha-{uuid.uuid4().hex[:6]}"), await api.tenant()
    for _ in range(3):
        await api.job(alpha, priority=2)
    for _ in range(2):
        await api.job(beta, priority=0)
    await api.job(beta, priority=1, pool="beta-only")
    await api.fire()
    await _register(api, api.admin, pool="default", capacity=10)
    await _register(api, await api.key(beta, "worker"), pool="beta-only", capacity=4)
    return alpha, beta


async def test_the_admin_sees_every_pool_and_every_tenants_backlog(api: Any) -> None:
    alpha, beta = await _scene(api)
    r = await api.client.get("/v1/pools", headers=api.admin)
    assert r.status_code == 200, r.text
    pools = _by_name(r.json())
    assert set(pools) == {"default", "beta-only"}
    default = pools["default"]
    assert _backlog(default) == {(beta.name, "P0"): (2, 0), (alpha.name, "P2"): (3, 0)}
    assert [b["priority"] for b in default["backlog"]] == [0, 2]  # P0 first
    assert (default["workers"], default["capacity"], default["busy"], default["free"]) == (
        1,
        10,
        0,
        10,
    )
    assert (default["p0_reserved_share"], default["effective_share"]) == (None, 0.0)
    assert default["p0_reserved_slots"] == 0  # none kept unless the pool keeps a share
    assert (default["ready"], default["due"]) == (5, 0)

    # One tenant's view, with the header.
    r = await api.client.get("/v1/pools", headers={**api.admin, "Cronwheel-Tenant": alpha.id})
    assert _backlog(_by_name(r.json())["default"]) == {(alpha.name, "P2"): (3, 0)}


@pytest.mark.parametrize("role", ["operator", "viewer"])
async def test_a_tenant_sees_only_its_own_numbers(api: Any, role: str) -> None:
    alpha, beta = await _scene(api)
    headers = alpha.headers if role == "operator" else await api.key(alpha, "viewer")
    r = await api.client.get("/v1/pools", headers=headers)
    assert r.status_code == 200, r.text
    pools = _by_name(r.json())
    assert set(pools) == {"default"}  # beta's own pool and worker are not told
    default = pools["default"]
    assert _backlog(default) == {(alpha.name, "P2"): (3, 0)}
    assert default["free"] is None and default["capacity"] == 10
    assert beta.name not in r.text and beta.id not in r.text

    # Naming beta's pool tells nothing of beta's: no worker, no backlog.
    r = await api.client.get("/v1/pools/beta-only", headers=headers)
    assert r.status_code == 200, r.text
    assert (r.json()["workers"], r.json()["backlog"], r.json()["ready"]) == (0, [], 0)
    assert beta.name not in r.text

    # A worker key reads nothing here.
    r = await api.client.get("/v1/pools", headers=await api.key(alpha, "worker"))
    assert r.status_code == 403


async def test_the_admin_sets_the_p0_share_and_it_is_audited(api: Any, store: Any) -> None:
    await _scene(api)
    r = await api.client.put(
        "/v1/pools/default", json={"p0_reserved_share": 0.3}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["p0_reserved_share"], body["effective_share"], body["p0_reserved_slots"]) == (
        0.3,
        0.3,
        3,
    )
    assert body["updated_at"] is not None
    shown = (await api.client.get("/v1/pools/default", headers=api.admin)).json()
    assert shown["p0_reserved_share"] == 0.3 and shown["updated_at"] == body["updated_at"]

    r = await api.client.put(
        "/v1/pools/default", json={"p0_reserved_share": None}, headers=api.admin
    )
    assert r.status_code == 200 and r.json()["effective_share"] == 0.0
    page = await store.events_list(None, limit=1000)
    events = [(e.actor, e.data) for e in page.items if e.kind == "pool.updated"]
    assert events == [
        ("admin", {"pool": "default", "p0_reserved_share": 0.3, "previous": None}),
        ("admin", {"pool": "default", "p0_reserved_share": None, "previous": 0.3}),
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"p0_reserved_share": 1.5},
        {"p0_reserved_share": -0.1},
        {"p0_reserved_share": "0.5"},
        {"p0_reserved_share": True},
        {},
        {"p0_reserved_share": 0.5, "other": 1},
    ],
)
async def test_a_bad_share_is_refused_and_changes_nothing(api: Any, body: Any) -> None:
    r = await api.client.put("/v1/pools/default", json=body, headers=api.admin)
    assert r.status_code == 422, r.text
    assert error_of(r)["code"]
    shown = (await api.client.get("/v1/pools/default", headers=api.admin)).json()
    assert shown["p0_reserved_share"] is None and shown["updated_at"] is None


async def test_only_the_admin_sets_a_share(api: Any) -> None:
    t = await api.tenant()
    for headers in (t.headers, await api.key(t, "viewer"), await api.key(t, "worker")):
        r = await api.client.put(
            "/v1/pools/default", json={"p0_reserved_share": 0.5}, headers=headers
        )
        assert r.status_code == 403, r.text
    r = await api.client.put("/v1/pools/default", json={"p0_reserved_share": 0.5})
    assert r.status_code == 401
    shown = (await api.client.get("/v1/pools/default", headers=api.admin)).json()
    assert shown["p0_reserved_share"] is None


async def test_a_bad_pool_name_is_422(api: Any) -> None:
    r = await api.client.get(f"/v1/pools/{'x' * 101}", headers=api.admin)
    assert r.status_code == 422, r.text
    r = await api.client.put("/v1/pools/a%01b", json={"p0_reserved_share": 0.5}, headers=api.admin)
    assert r.status_code == 422, r.text


async def test_the_index_links_the_pools(api: Any) -> None:
    links = (await api.client.get("/")).json()["links"]
    assert links["pools"] == "/v1/pools"


def _gauges(text: str, name: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE)
    }


async def test_the_gauges_show_capacity_and_backlog_with_bounded_labels(api: Any) -> None:
    alpha, beta = await _scene(api)
    api.app.state.api.runs_by_state.max_age = 0
    text = (await api.client.get("/metrics", headers=api.admin)).text
    assert _gauges(text, "cronwheel_pool_capacity") == {
        'pool="default"': 10.0,
        f'pool="{LISTED}"': 0.0,
        'pool="other"': 4.0,  # beta's own pool: named by a tenant, not listed
    }
    assert _gauges(text, "cronwheel_pool_free_slots")['pool="default"'] == 10.0
    backlog = _gauges(text, "cronwheel_ready_backlog")
    assert backlog[f'pool="default",priority="P2",tenant="{alpha.name}"'] == 3.0
    assert backlog[f'pool="default",priority="P0",tenant="{beta.name}"'] == 2.0
    assert backlog[f'pool="other",priority="P1",tenant="{beta.name}"'] == 1.0
    assert "beta-only" not in text

    # Leased, alpha's backlog is gone: its series goes with it.
    key = await api.key(alpha, "worker")
    worker = await _register(api, key, pool="default", capacity=10)
    r = await api.client.post(f"/v1/workers/{worker}/lease", json={"max": 10}, headers=key)
    assert r.status_code == 200 and len(r.json()["attempts"]) == 3
    text = (await api.client.get("/metrics", headers=api.admin)).text
    backlog = _gauges(text, "cronwheel_ready_backlog")
    assert not any(alpha.name in labels for labels in backlog)
    assert _gauges(text, "cronwheel_pool_capacity")['pool="default"'] == 20.0
    assert _gauges(text, "cronwheel_pool_free_slots")['pool="default"'] == 17.0
