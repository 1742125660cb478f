"""The audit trail over HTTP, the SDK and the CLI, on both backends: who (key, role,
request id) did what, read by the tenant's keys and the admin key only, with clear
refusals for bad queries and request ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from answers import error_of
from typer.testing import CliRunner

from conftest import ADMIN_KEY
from cronwheel import AsyncClient, Client
from cronwheel.cli import app as cli_app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings

Driver = Any  # the integration conftest's ``api`` fixture


async def trail(api: Driver, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    r = await api.client.get("/v1/audit", params=params, headers=headers)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def test_changes_carry_key_role_and_request_id(api: Driver) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/pause",
        json={"reason": "deploy"},
        headers={**t.headers, "X-Request-Id": "deploy-42"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "deploy-42"
    r = await api.client.post(f"/v1/jobs/{job['id']}/resume", headers=t.headers)
    assert r.status_code == 200, r.text
    made = r.headers["x-request-id"]  # none sent: the API names the request itself
    assert made

    resume, pause, created = await trail(api, t.headers, target_kind="job")
    assert created["action"] == "job.create"
    key_id = (await api.client.get(f"/v1/tenants/{t.id}/keys", headers=api.admin)).json()["items"][
        0
    ]["id"]
    assert pause["action"] == "job.pause" and pause["target_id"] == job["id"]
    assert (pause["actor"], pause["role"], pause["key_id"]) == (key_id, "operator", key_id)
    assert (pause["request_id"], pause["reason"]) == ("deploy-42", "deploy")
    assert pause["before"] == {"state": "active"}
    assert pause["after"] == {"state": "paused", "runs": {"parked": 1}}
    assert (resume["action"], resume["request_id"]) == ("job.resume", made)


async def test_tenants_read_their_own_trail_and_the_admin_reads_all(api: Driver) -> None:
    a, b = await api.tenant(), await api.tenant()
    for t in (a, b):
        job = await api.job(t, schedule={"delay": 600})
        r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
        assert r.status_code == 200, r.text
    r = await api.client.put("/v1/pools/gpu", json={"p0_reserved_share": 0.5}, headers=api.admin)
    assert r.status_code == 200, r.text

    viewer = await api.key(a, "viewer")
    seen = await trail(api, viewer, action="job.cancel")
    assert [x["tenant_id"] for x in seen] == [a.id]
    everything = await trail(api, api.admin)
    assert {x["tenant_id"] for x in everything} >= {a.id, b.id, None}
    # The admin key naming a tenant reads that tenant's, as its keys do.
    only_b = await trail(api, {**api.admin, "Cronwheel-Tenant": b.id}, action="job.cancel")
    assert [x["tenant_id"] for x in only_b] == [b.id]
    # Who set the pool: the admin key of the settings.
    [pool] = await trail(api, api.admin, target_kind="pool")
    assert (pool["actor"], pool["role"], pool["key_id"]) == ("admin", "admin", None)

    worker = await api.key(a, "worker")
    r = await api.client.get("/v1/audit", headers=worker)
    assert r.status_code == 403, r.text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "abc"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2031-01-02T00:00:00Z", "until": "2031-01-01T00:00:00Z"}, "until"),
        ({"action": "x" * 61}, "action"),
    ],
)
async def test_bad_queries_are_refused(api: Driver, params: dict[str, str], field: str) -> None:
    t = await api.tenant()
    r = await api.client.get("/v1/audit", params=params, headers=t.headers)
    assert r.status_code == 422, r.text
    assert field in r.text


@pytest.mark.parametrize("request_id", [b"", b"x" * 201, "caf\u00e9".encode(), b"a\x7fb"])
async def test_an_unusable_request_id_is_refused_and_changes_nothing(
    api: Driver, request_id: bytes
) -> None:
    t = await api.tenant()
    job = await api.job(t, schedule={"delay": 600})
    before = await api.snapshot(t)
    r = await api.client.post(
        f"/v1/jobs/{job['id']}/pause",
        headers=[*t.headers.items(), ("X-Request-Id", request_id)],
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "invalid_request_id"
    assert await api.snapshot(t) == before
    assert await trail(api, t.headers, action="job.pause") == []


# -- the SDK and the CLI against a real server ---------------------------------------------


@pytest.fixture
def server(store_url: str, tmp_path: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings, scheduler=False)) as running,
        Client(running.url, api_key=ADMIN_KEY) as admin,
    ):
        yield running.url, admin.tenants.create(f"audit-{uuid.uuid4().hex[:6]}")


def test_the_sdk_reads_the_trail(server: tuple[str, dict[str, Any]]) -> None:
    url, tenant = server
    with Client(url, api_key=tenant["api_key"]) as client:
        jobs = [
            client.jobs.create(name=f"j{i}", schedule={"delay": 600}, task="t") for i in range(3)
        ]
        for job in jobs:
            client.jobs.pause(job["id"], reason="freeze")
        page = client.audit.list(action="job.pause", limit=2)
        assert [r["target_id"] for r in page.items] == [jobs[2]["id"], jobs[1]["id"]]
        every = list(client.audit.iter(action="job.pause", page_size=1))
        assert [r["target_id"] for r in every] == [j["id"] for j in reversed(jobs)]
        assert {r["reason"] for r in every} == {"freeze"}


async def test_the_async_sdk_reads_the_trail(server: tuple[str, dict[str, Any]]) -> None:
    url, tenant = server
    async with AsyncClient(url, api_key=tenant["api_key"]) as client:
        job = await client.jobs.create(name="j", schedule={"delay": 600}, task="t")
        await client.jobs.cancel(job["id"], reason="bye")
        page = await client.audit.list(target=job["id"])
        assert [(r["action"], r["reason"]) for r in page.items] == [
            ("job.cancel", "bye"),
            ("job.create", None),
        ]
        every = [r["id"] async for r in client.audit.iter(target=job["id"], page_size=1)]
        assert every == [r["id"] for r in page.items]


def cli(url: str, key: str, *args: str) -> Any:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": key, "COLUMNS": "250"}
    return CliRunner().invoke(cli_app, list(args), env=env)


def test_the_cli_shows_the_trail(server: tuple[str, dict[str, Any]]) -> None:
    url, tenant = server
    with Client(url, api_key=tenant["api_key"]) as client:
        job = client.jobs.create(name="nightly", schedule={"delay": 600}, task="t")
        client.jobs.pause(job["id"], reason="freeze")
    shown = cli(url, tenant["api_key"], "audit", "--action", "job.pause")
    assert shown.exit_code == 0, shown.output
    assert "audit (1)" in shown.stdout
    assert "job.pause" in shown.stdout and "freeze" in shown.stdout
    assert "state: active → paused" in shown.stdout
    as_json = cli(url, tenant["api_key"], "audit", "--json", "--target", job["id"])
    assert as_json.exit_code == 0, as_json.output
    assert '"action": "job.pause"' in as_json.stdout

    bad = cli(url, tenant["api_key"], "audit", "--since", "tomorrow")
    assert bad.exit_code == 2 and "--since" in bad.output
    refused = cli(url, tenant["api_key"], "audit", "--cursor", "nope")
    assert refused.exit_code == 1 and "cursor" in refused.output


async def test_creations_are_audited_per_request(api: Driver) -> None:
    t = await api.tenant()
    r = await api.client.post(
        "/v1/jobs",
        json={"name": "one", "schedule": {"delay": 600}, "task": "t"},
        headers={**t.headers, "X-Request-Id": "create-1"},
    )
    assert r.status_code == 201, r.text
    one = r.json()
    jobs = [{"name": f"b{i}", "schedule": {"delay": 600}, "task": "t"} for i in range(3)]
    r = await api.client.post(
        "/v1/jobs/batch",
        json={"jobs": jobs},
        headers={**t.headers, "X-Request-Id": "create-many"},
    )
    assert r.status_code == 201, r.text
    made = [item["id"] for item in r.json()["items"]]
    # A refused batch (the second job is bad) created nothing and left no record.
    bad = [jobs[0], {"name": "x", "schedule": {"cron": "61 * * * *"}, "task": "t"}]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": bad}, headers=t.headers)
    assert r.status_code == 422, r.text

    many, single = await trail(api, t.headers, action="job.create")
    assert (single["request_id"], single["target_id"]) == ("create-1", one["id"])
    assert single["after"] == {"name": "one"} and single["role"] == "operator"
    assert (many["request_id"], many["target_id"]) == ("create-many", None)
    assert many["after"] == {"count": 3, "jobs": made}
