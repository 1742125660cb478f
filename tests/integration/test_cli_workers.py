"""``cronwheel workers list`` and ``cronwheel jobs create --route-tag`` against a real
server (API + scheduler on a free port), with the clients' ``workers.list`` beneath
them, on both backends: a tenant never sees another tenant's workers."""

from __future__ import annotations

import json
import uuid
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from cronwheel import AsyncClient, Client
from cronwheel.cli import app
from cronwheel.client import Call

ADMIN = "adm"  # the admin key of the ``live`` server


def _cli(url: str, key: str, *args: str) -> Result:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": key, "COLUMNS": "300"}
    return CliRunner().invoke(app, list(args), env=env)


def _register(url: str, key: str, **body: Any) -> dict[str, Any]:
    with Client(url, api_key=key) as client:
        answer: dict[str, Any] = client.send(Call("POST", "/v1/workers", json=body))
    return answer


def test_workers_list_shows_a_tenant_its_workers_only(live: tuple[str, Client, str]) -> None:
    url, operator, worker_key = live
    with Client(url, api_key=ADMIN) as admin:
        other = admin.tenants.create(f"other-{uuid.uuid4().hex[:6]}")
        other_worker_key = admin.tenants.create_key(other["id"], role="worker")["api_key"]
    registered = _register(url, worker_key, name="reporter", tasks=["reports.build"], tags=["red"])
    mine, tenant_id = registered["worker_id"], registered["tenant_id"]
    theirs = _register(url, other_worker_key, name="stranger", pool="secret-pool")["worker_id"]
    key = operator.api_key or ""

    shown = _cli(url, key, "workers", "list")
    assert shown.exit_code == 0, shown.output
    assert mine in shown.stdout and "reporter" in shown.stdout
    assert "reports.build" in shown.stdout and "red" in shown.stdout and "live" in shown.stdout
    assert theirs not in shown.stdout and "stranger" not in shown.stdout
    assert "secret-pool" not in shown.stdout

    as_json = _cli(url, key, "workers", "list", "--json")
    assert as_json.exit_code == 0, as_json.output
    listed = json.loads(as_json.stdout)
    assert listed["next_cursor"] is None
    assert mine in {w["id"] for w in listed["items"]}
    assert {w["tenant_id"] for w in listed["items"]} <= {tenant_id, None}
    assert [w["id"] for w in listed["items"]] == [w["id"] for w in operator.workers.list().items]

    everyone = _cli(url, ADMIN, "workers", "list", "--json")
    assert everyone.exit_code == 0, everyone.output
    assert {mine, theirs} <= {w["id"] for w in json.loads(everyone.stdout)["items"]}
    by_pool = _cli(url, ADMIN, "workers", "list", "--pool", "secret-pool", "--json")
    assert [w["id"] for w in json.loads(by_pool.stdout)["items"]] == [theirs]

    refused = _cli(url, worker_key, "workers", "list")
    assert refused.exit_code == 1
    assert "worker keys may use only the worker protocol" in refused.output


async def test_the_async_client_lists_workers_alike(live: tuple[str, Client, str]) -> None:
    url, operator, worker_key = live
    mine = _register(url, worker_key, pool="async-pool")["worker_id"]
    async with AsyncClient(url, api_key=operator.api_key) as client:
        page = await client.workers.list(pool="async-pool")
    assert [w["id"] for w in page.items] == [mine]
    assert page.items == operator.workers.list(pool="async-pool").items


def test_jobs_create_takes_route_tags(live: tuple[str, Client, str]) -> None:
    url, operator, _ = live
    created = _cli(
        url,
        operator.api_key or "",
        "jobs", "create", "--name", "routed", "--task", "train", "--delay", "3600",
        "--route-tag", "red", "--route-tag", "eu", "--tag", "billing", "--json",
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    job = json.loads(created.stdout)
    assert (job["route_tags"], job["tags"]) == (["red", "eu"], ["billing"])
    assert operator.jobs.get(job["id"])["route_tags"] == ["red", "eu"]

    bad = _cli(
        url, operator.api_key or "", "jobs", "create", "--name", "bad", "--task", "t", "--asap",
        "--route-tag", "",
    )  # fmt: skip
    assert bad.exit_code == 1
    assert "route_tags" in bad.output
