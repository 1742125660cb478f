"""Bulk operations over HTTP, on both backends: 202 at once, carried out by the API's own
runner, followed at /v1/operations/{id}; bad input is a JSON 4xx and changes nothing;
another tenant's ids are "not found" and untouched."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import ADMIN_KEY
from cronwheel import AsyncClient, Client
from cronwheel.cli import app as cli_app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store.sql import bulk
from cronwheel.testing import wait_until_async

Driver = Any  # the integration conftest's ``api`` fixture


async def finished(api: Driver, headers: dict[str, str], location: str) -> dict[str, Any]:
    """The operation at ``location`` once it is done (or failed)."""
    last: dict[str, Any] = {}

    async def over() -> bool:
        nonlocal last
        r = await api.client.get(location, headers=headers)
        assert r.status_code == 200, r.text
        last = r.json()
        return last["state"] in ("done", "failed")

    await wait_until_async(over, 20, what="the operation to end", interval=0.02)
    return last


async def test_bulk_cancel_by_tag(api: Driver) -> None:
    t = await api.tenant()
    billing = [
        await api.job(t, name=f"b{i}", schedule={"delay": 600}, tags=["billing"]) for i in range(3)
    ]
    other = await api.job(t, name="o", schedule={"delay": 600}, tags=["ops"])
    r = await api.client.post(
        "/v1/bulk/cancel",
        json={"selector": {"tags_all": ["billing"]}, "reason": "bad deploy"},
        headers={**t.headers, "X-Request-Id": "bulk-7"},
    )
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert accepted["state"] in ("pending", "running", "done")
    assert r.headers["location"] == f"/v1/operations/{accepted['id']}"
    done = await finished(api, t.headers, r.headers["location"])
    assert done["state"] == "done", done
    assert (done["matched"], done["changed"], done["skipped"]) == (3, 3, {})
    assert done["selector"] == {"tags_all": ["billing"]} and done["reason"] == "bad deploy"
    for job in billing:
        run = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
        assert (run["state"], run["reason"]) == ("CANCELLED", "bad deploy")
    run = (await api.client.get(f"/v1/runs/{other['first_run_id']}", headers=t.headers)).json()
    assert run["state"] == "SCHEDULED"
    # Who asked, in the audit trail; the operation in the tenant's list.
    r = await api.client.get("/v1/audit", params={"action": "bulk.cancel"}, headers=t.headers)
    [record] = r.json()["items"]
    assert (record["target_id"], record["request_id"]) == (accepted["id"], "bulk-7")
    listed = (await api.client.get("/v1/operations", headers=t.headers)).json()["items"]
    assert [o["id"] for o in listed] == [accepted["id"]]


async def test_pause_everything_and_resume_it(api: Driver) -> None:
    t = await api.tenant()
    jobs = [await api.job(t, name=f"j{i}", schedule={"delay": 600}) for i in range(2)]
    r = await api.client.post("/v1/bulk/pause", json={"all": True}, headers=t.headers)
    assert r.status_code == 202, r.text
    done = await finished(api, t.headers, r.headers["location"])
    assert (done["state"], done["changed"]) == ("done", 2)
    for job in jobs:
        got = (await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)).json()
        assert got["state"] == "paused"
    r = await api.client.post(
        "/v1/bulk/resume", json={"selector": {"job_ids": [jobs[0]["id"]]}}, headers=t.headers
    )
    done = await finished(api, t.headers, r.headers["location"])
    assert (done["changed"], done["skipped"]) == (1, {})
    states = [
        (await api.client.get(f"/v1/jobs/{j['id']}", headers=t.headers)).json()["state"]
        for j in jobs
    ]
    assert states == ["active", "paused"]


async def test_another_tenants_ids_are_not_found_and_untouched(api: Driver) -> None:
    t, other = await api.tenant(), await api.tenant()
    mine = await api.job(t, schedule={"delay": 600})
    theirs = await api.job(other, schedule={"delay": 600})
    r = await api.client.post(
        "/v1/bulk/cancel",
        json={"selector": {"run_ids": [mine["first_run_id"], theirs["first_run_id"]]}},
        headers=t.headers,
    )
    done = await finished(api, t.headers, r.headers["location"])
    assert (done["matched"], done["changed"], done["skipped"]) == (2, 1, {"not found": 1})
    run = await api.client.get(f"/v1/runs/{theirs['first_run_id']}", headers=other.headers)
    assert run.json()["state"] == "SCHEDULED"
    # Nor can the other tenant read the operation.
    r = await api.client.get(r.headers["location"], headers=other.headers)
    assert r.status_code == 404, r.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/bulk/cancel", {"selector": {"tag": "x"}}, "tag"),
        ("/v1/bulk/cancel", {}, "selector"),
        ("/v1/bulk/cancel", {"selector": {}, "reason": "oops"}, "selector"),
        ("/v1/bulk/pause", {"all": True, "selector": {"pool": "p"}}, "selector.all"),
        ("/v1/bulk/pause", {"selector": {"run_ids": []}}, "selector.run_ids"),
        ("/v1/bulk/cancel", {"selector": {"states": ["SUCCESS"]}}, "states"),
        ("/v1/bulk/redrive", {"selector": {"states": ["RUNNING"]}}, "selector.states"),
        ("/v1/bulk/cancel", {"selector": {"job_ids": ["nope"]}}, "job_ids"),
        ("/v1/bulk/cancel", {"all": "yes"}, "all"),
        ("/v1/bulk/explode", {"all": True}, "action"),
        (
            "/v1/bulk/cancel",
            {
                "selector": {
                    "due_after": "2031-01-02T00:00:00Z",
                    "due_before": "2031-01-01T00:00:00Z",
                }
            },
            "selector.due_before",
        ),
    ],
)
async def test_bad_requests_change_nothing(
    api: Driver, path: str, body: dict[str, Any], field: str
) -> None:
    t = await api.tenant()
    await api.job(t, schedule={"delay": 600})
    before = await api.snapshot(t)
    r = await api.client.post(path, json=body, headers=t.headers)
    assert r.status_code == 422, r.text
    assert field in r.text
    assert await api.snapshot(t) == before
    assert (await api.client.get("/v1/operations", headers=t.headers)).json()["items"] == []


async def test_another_tenants_small_operation_ends_while_a_large_one_runs(
    api: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One run a step: the large operation takes 41 steps, the small one 2.
    monkeypatch.setattr(bulk, "STEP", 1)
    big, small = await api.tenant(), await api.tenant()
    for i in range(40):
        await api.job(big, name=f"b{i}", schedule={"delay": 600}, tags=["x"])
    await api.job(small, name="s", schedule={"delay": 600}, tags=["x"])
    body = {"selector": {"tags_all": ["x"]}}
    large = await api.client.post("/v1/bulk/cancel", json=body, headers=big.headers)
    assert large.status_code == 202, large.text
    r = await api.client.post("/v1/bulk/cancel", json=body, headers=small.headers)
    done = await finished(api, small.headers, r.headers["location"])
    assert (done["state"], done["changed"]) == ("done", 1)
    still = (await api.client.get(large.headers["location"], headers=big.headers)).json()
    assert still["state"] == "running" and still["changed"] < 40, still
    done = await finished(api, big.headers, large.headers["location"])
    assert (done["state"], done["changed"]) == ("done", 40)


async def test_a_tenant_at_its_limit_of_open_operations_gets_a_429(api: Driver) -> None:
    state = api.app.state.api
    # Nothing carries the operations out here: they stay open.
    await state.operations.close()
    state.settings.max_open_operations = 2
    t, other = await api.tenant(), await api.tenant()
    await api.job(t, schedule={"delay": 600}, tags=["x"])
    for _ in range(2):
        r = await api.client.post(
            "/v1/bulk/cancel", json={"selector": {"tags_all": ["x"]}}, headers=t.headers
        )
        assert r.status_code == 202, r.text
    before = await api.snapshot(t)
    r = await api.client.post("/v1/bulk/pause", json={"all": True}, headers=t.headers)
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["details"] == {"limit": "max_open_operations", "open": 2, "max": 2}
    assert "max_open_operations" in error["message"]
    assert await api.snapshot(t) == before
    listed = (await api.client.get("/v1/operations", headers=t.headers)).json()["items"]
    assert len(listed) == 2
    audited = await api.client.get("/v1/audit", params={"action": "bulk.pause"}, headers=t.headers)
    assert audited.json()["items"] == []
    # Another tenant has a count of its own.
    r = await api.client.post("/v1/bulk/pause", json={"all": True}, headers=other.headers)
    assert r.status_code == 202, r.text


async def test_who_may_do_what(api: Driver) -> None:
    t = await api.tenant()
    viewer = await api.key(t, "viewer")
    r = await api.client.post("/v1/bulk/pause", json={"all": True}, headers=viewer)
    assert r.status_code == 403, r.text
    r = await api.client.get("/v1/operations", headers=viewer)
    assert r.status_code == 200, r.text
    # A malformed id names no operation, as everywhere in the API.
    r = await api.client.get("/v1/operations/not-an-id", headers=t.headers)
    assert r.status_code == 404, r.text


# -- the SDK and the CLI against a real server ---------------------------------------------


@pytest.fixture
def server(store_url: str, tmp_path: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings, scheduler=False)) as running,
        Client(running.url, api_key=ADMIN_KEY) as admin,
    ):
        yield running.url, admin.tenants.create(f"bulk-{uuid.uuid4().hex[:6]}")


def cli(url: str, key: str, *args: str) -> Any:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": key, "COLUMNS": "200"}
    return CliRunner().invoke(cli_app, list(args), env=env)


def test_the_cli_cancels_by_tag_and_shows_the_counts(server: tuple[str, dict[str, Any]]) -> None:
    url, tenant = server
    with Client(url, api_key=tenant["api_key"]) as client:
        made = [
            client.jobs.create(name=f"b{i}", schedule={"delay": 600}, task="t", tags=["billing"])
            for i in range(3)
        ]
    done = cli(url, tenant["api_key"], "bulk", "cancel", "--tag", "billing", "--reason", "oops")
    assert done.exit_code == 0, done.output
    shown = {
        cells[0]: cells[1]
        for line in done.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert (shown["state"], shown["matched"], shown["changed"]) == ("done", "3", "3")
    with Client(url, api_key=tenant["api_key"]) as client:
        states = {client.runs.get(job["first_run_id"])["state"] for job in made}
    assert states == {"CANCELLED"}
    listed = cli(url, tenant["api_key"], "operations", "list")
    assert listed.exit_code == 0 and "operations (1)" in listed.stdout and "cancel" in listed.stdout

    refused = cli(url, tenant["api_key"], "bulk", "pause")
    assert refused.exit_code == 1 and "empty selector" in refused.output
    bad = cli(url, tenant["api_key"], "bulk", "cancel", "--id", "nope")
    assert bad.exit_code == 2 and "--id" in bad.output


async def test_the_async_sdk_pauses_and_waits(server: tuple[str, dict[str, Any]]) -> None:
    url, tenant = server
    async with AsyncClient(url, api_key=tenant["api_key"]) as client:
        job = await client.jobs.create(name="nightly", schedule={"delay": 600}, task="t")
        op = await client.bulk("pause", job_ids=[job["id"]], reason="freeze")
        done = await client.operations.wait(op["id"], timeout=20)
        assert (done["state"], done["changed"]) == ("done", 1)
        assert (await client.jobs.get(job["id"]))["state"] == "paused"
