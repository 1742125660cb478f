"""Probes, metrics, the OpenAPI document and answers for routes that do not exist."""

from __future__ import annotations

import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cronwheel.api import create_app
from cronwheel.settings import Settings
from cronwheel.store import Store, create_store
from pg_server import pg_admin
from pg_server import pg_url as database_url

ADMIN = {"Authorization": "Bearer test-admin-key-0123456789"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_healthz_and_readyz(api) -> None:
    r = await api.client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = await api.client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}


async def test_readyz_is_503_when_the_store_is_down(settings: Settings, store_url: str) -> None:
    down = create_store(store_url)  # never opened: it cannot answer
    app = create_app(settings, down)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cw") as client:
        r = await client.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_unavailable"
        r = await client.get("/healthz")
        assert r.status_code == 200  # alive all the same


async def test_metrics(api, app, store: Store) -> None:
    t = await api.tenant()
    await api.job(t)
    await api.job(t, schedule={"delay": 600})
    await api.fire()
    worker = await api.key(t, "worker")
    wid = (await api.client.post("/v1/workers", json={}, headers=worker)).json()["worker_id"]

    before = samples((await api.client.get("/metrics", headers=api.admin)).text)
    # By tenant name and priority class (the default priority 2: P2).
    start_key = (
        "cronwheel_start_lateness_seconds_count",
        (("priority", "P2"), ("tenant", t.name)),
    )
    start_count = before.get(start_key, 0.0)
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 5}, headers=worker)
    assert len(r.json()["attempts"]) == 1
    await api.client.get("/v1/jobs/not-an-id", headers=t.headers)

    r = await api.client.get("/metrics", headers=api.admin)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    after = samples(r.text)
    assert after[start_key] == start_count + 1
    # Counted by route template, never by the raw path.
    key = (
        "cronwheel_api_requests_total",
        (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404")),
    )
    assert after[key] == before.get(key, 0.0) + 1
    assert not any("not-an-id" in str(labels) for _, labels in after)
    assert not any(
        name.startswith("cronwheel_dispatch_lateness") and not labels for name, labels in after
    )

    # Runs by state come from the store, counted at most once per few seconds.
    def runs(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], state: str) -> float:
        return scrape[("cronwheel_runs", (("state", state),))]

    assert (runs(before, "SCHEDULED"), runs(before, "DISPATCHED"), runs(before, "RUNNING")) == (
        1,
        1,
        0,
    )
    assert runs(after, "RUNNING") == 0  # the cached count
    app.state.api.runs_by_state.max_age = 0
    fresh = samples((await api.client.get("/metrics", headers=api.admin)).text)
    counts = await store.runs_count_by_state()
    for state in ("SCHEDULED", "DISPATCHED", "RUNNING", "SUCCESS"):
        assert runs(fresh, state) == counts.get(state, 0)
    assert (runs(fresh, "DISPATCHED"), runs(fresh, "RUNNING")) == (0, 1)


METRICS_TOKEN = "prometheus-scrape-token-42"


async def test_metrics_answer_only_to_the_metrics_token_or_the_admin_key(
    settings: Settings, store: Store
) -> None:
    app = create_app(settings.model_copy(update={"metrics_token": METRICS_TOKEN}), store)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cw") as client:
        r = await client.post(
            "/v1/tenants", json={"name": f"m-{uuid.uuid4().hex[:6]}"}, headers=ADMIN
        )
        operator = {"Authorization": f"Bearer {r.json()['api_key']}"}
        for headers, status, code in (
            ({}, 401, "unauthorized"),
            ({"Authorization": "Bearer not-the-token"}, 401, "unauthorized"),
            ({"Authorization": f"Basic {METRICS_TOKEN}"}, 401, "unauthorized"),
            (operator, 403, "forbidden"),
        ):
            r = await client.get("/metrics", headers=headers)
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code
            assert "cronwheel_" not in r.text
        for headers in ({"Authorization": f"Bearer {METRICS_TOKEN}"}, ADMIN):
            r = await client.get("/metrics", headers=headers)
            assert r.status_code == 200, r.text
            assert "cronwheel_api_requests_total" in r.text
        # The probes stay open for load balancers.
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200


async def test_without_a_metrics_token_only_the_admin_key_reads_them(api) -> None:
    assert api.app.state.settings.metrics_token is None
    worker = await api.key(await api.tenant(), "worker")
    assert (await api.client.get("/metrics", headers=worker)).status_code == 403
    assert (await api.client.get("/metrics")).status_code == 401
    assert (await api.client.get("/metrics", headers=api.admin)).status_code == 200
    doc = (await api.client.get("/openapi.json")).json()["paths"]["/metrics"]["get"]
    assert "metrics_token" in doc["description"] and doc["security"]


async def test_no_tenant_chosen_pool_name_reaches_the_metrics(api, store: Store) -> None:
    """Pools are named by tenants: only the operator's list gets label values of its
    own, whatever a tenant writes (quotes and braces included; a newline is not even
    a pool name)."""
    t = await api.tenant()
    named = [
        f"acme-private-pool-{uuid.uuid4().hex[:8]}",
        'evil"} 1 cronwheel_fake{x="',
        "other-tenant-secret-project",
    ]
    for pool in named:
        await api.job(t, pool=pool, requires=["cuda"])
    await api.job(t, pool="default", requires=["cuda"])
    await api.fire()
    await store.runs_route_check(shards=list(range(256)), min_wait=0.0, worker_ttl=30.0)
    api.app.state.api.runs_by_state.max_age = 0

    text = (await api.client.get("/metrics", headers=api.admin)).text
    for pool in named:
        assert pool not in text
    assert "acme-private" not in text and "secret-project" not in text
    assert "cronwheel_fake" not in text
    unroutable = {
        labels: value
        for (name, labels), value in samples(text).items()
        if name == "cronwheel_runs_unroutable"
    }
    assert unroutable[(("pool", "default"),)] == 1.0
    assert unroutable[(("pool", "other"),)] == 3.0


def test_other_cannot_be_listed_as_a_metrics_pool() -> None:
    with pytest.raises(ValueError, match="other"):
        Settings(metrics_pools=["default", "other"])
    assert Settings(metrics_pools="gpu, default,gpu").metrics_pools == ["gpu", "default"]


async def test_unknown_routes_are_json_404(api) -> None:
    for method, path in (("GET", "/nope"), ("POST", "/v1/nothing"), ("GET", "/v1/jobs/x/y")):
        r = await api.client.request(method, path)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "not_found"
    r = await api.client.delete("/v1/jobs")
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"


async def test_a_wrong_method_is_answered_with_every_method_of_the_resource(api) -> None:
    t = await api.tenant()
    job = await api.job(t)
    # Each of these paths is served by more than one route, one per method.
    for method, path, allowed in (
        ("DELETE", "/v1/jobs", {"GET", "POST"}),
        ("OPTIONS", "/v1/tenants", {"GET", "POST"}),
        ("PUT", f"/v1/tenants/{t.id}", {"DELETE", "GET", "PATCH"}),
        ("PUT", f"/v1/jobs/{job['id']}", {"DELETE", "GET", "PATCH"}),
        ("GET", "/v1/workers/x", {"DELETE"}),
        # The literal path is the resource, not a job named "batch".
        ("OPTIONS", "/v1/jobs/batch", {"POST"}),
    ):
        r = await api.client.request(method, path, headers=t.headers)
        assert r.status_code == 405, (method, path, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed"
        assert {m.strip() for m in r.headers["allow"].split(",")} == allowed, (path, r.headers)


async def test_openapi_documents_every_route(api) -> None:
    r = await api.client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    paths = doc["paths"]
    expected = {
        ("post", "/v1/tenants"),
        ("get", "/v1/tenants"),
        ("get", "/v1/tenants/{tenant_id}"),
        ("patch", "/v1/tenants/{tenant_id}"),
        ("post", "/v1/tenants/{tenant_id}/keys"),
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs"),
        ("get", "/v1/jobs/{job_id}"),
        ("post", "/v1/jobs/{job_id}/cancel"),
        ("get", "/v1/runs"),
        ("get", "/v1/runs/{run_id}"),
        ("post", "/v1/runs/{run_id}/cancel"),
        ("post", "/v1/workers"),
        ("post", "/v1/workers/{worker_id}/lease"),
        ("post", "/v1/attempts/{attempt_id}/heartbeat"),
        ("post", "/v1/attempts/{attempt_id}/complete"),
        ("post", "/v1/attempts/{attempt_id}/fail"),
        ("post", "/v1/attempts/{attempt_id}/release"),
        ("post", "/v1/attempts/batch"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
    }
    documented = {(m, p) for p, ops in paths.items() for m in ops}
    assert expected <= documented
    for method, path in expected:
        op = paths[path][method]
        assert op.get("summary"), (method, path)
        if path.startswith("/v1/"):
            ref = op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorResponse")
            assert op.get("security"), (method, path)
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    params = {p["name"] for p in paths["/v1/jobs"]["post"]["parameters"]}
    assert {"Idempotency-Key", "Cronwheel-Tenant"} <= params
    assert "JobSpec" in doc["components"]["schemas"]


async def test_admin_routes_reject_tenant_keys_even_for_unknown_ids(api) -> None:
    t = await api.tenant()
    r = await api.client.patch(
        f"/v1/tenants/{uuid.uuid4()}", json={"limits": {}}, headers=t.headers
    )
    assert r.status_code == 403


async def test_no_free_connection_is_503_with_retry_after(settings: Settings, pg_url: str) -> None:
    """The database has no connection for the API (every slot taken — here a role that
    may open none): a moment of overload, answered 503 with Retry-After, never a 500."""
    role = f"cw_full_{uuid.uuid4().hex[:8]}"
    await pg_admin(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    full = create_store(database_url(pg_url.rsplit("/", 1)[1], user=role), pool_size=2)
    await full.open()
    try:
        app = create_app(settings, full)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cw") as client:
            headers = {**ADMIN, "Cronwheel-Tenant": str(uuid.uuid4())}
            r = await client.get("/v1/jobs", headers=headers)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_unavailable"
            assert "too many connections" in r.json()["error"]["message"]
            assert r.headers["Retry-After"] == "1"
    finally:
        await full.close()
        await pg_admin(f'DROP ROLE "{role}"')
