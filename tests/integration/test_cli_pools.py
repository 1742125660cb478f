"""``cronwheel pools list|show|set`` against a real server (API + scheduler on a free
port), with the clients' ``pools`` beneath them, on both backends: a tenant sees its
own backlog only, and only the admin sets a pool's P0 share."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from cronwheel import AsyncClient, Client
from cronwheel.cli import app
from cronwheel.client import ApiError, Call
from cronwheel.testing import wait_until

ADMIN = "adm"  # the admin key of the ``live`` server


def _cli(url: str, key: str, *args: str) -> Result:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": key, "COLUMNS": "300"}
    return CliRunner().invoke(app, list(args), env=env)


def _ready(client: Client, pool: str) -> int:
    shown: int = client.pools.get(pool)["ready"]
    return shown


def test_pools_list_show_and_set(live: tuple[str, Client, str]) -> None:
    url, operator, worker_key = live
    pool = f"p-{uuid.uuid4().hex[:6]}"
    with Client(url, api_key=ADMIN) as admin:
        other = admin.tenants.create(f"other-{uuid.uuid4().hex[:6]}")
    with Client(url, api_key=other["api_key"]) as theirs:
        theirs.jobs.create(name="x", schedule={"asap": True}, task="t", pool=pool)
    operator.jobs.create(name="mine", schedule={"asap": True}, task="t", pool=pool, priority=0)
    with Client(url, api_key=worker_key) as worker:
        worker.send(Call("POST", "/v1/workers", json={"pool": pool, "capacity": 10}))
    with Client(url, api_key=ADMIN) as admin:
        wait_until(lambda: _ready(admin, pool) == 2, timeout=30)  # the scheduler fired both

        # The admin sets the share; a tenant may not.
        try:
            operator.pools.update(pool, p0_reserved_share=0.5)
        except ApiError as exc:
            assert exc.status == 403
        else:
            raise AssertionError("a tenant set a pool's share")
        set_ = _cli(url, ADMIN, "pools", "set", pool, "--p0-share", "0.3", "--json")
        assert set_.exit_code == 0, set_.output
        assert json.loads(set_.stdout)["p0_reserved_share"] == 0.3
        assert admin.pools.get(pool)["p0_reserved_slots"] == 3  # floor(0.3 x 10)
        refused = _cli(url, ADMIN, "pools", "set", pool)
        assert refused.exit_code == 2
        assert _cli(url, ADMIN, "pools", "set", pool, "--p0-share", "1.5").exit_code == 2

        listed = _cli(url, ADMIN, "pools", "list")
        assert listed.exit_code == 0, listed.output
        assert pool in listed.stdout and other["name"] in listed.stdout
        assert "0.3" in listed.stdout and "P0" in listed.stdout

    key = operator.api_key or ""
    mine = _cli(url, key, "pools", "show", pool)
    assert mine.exit_code == 0, mine.output
    assert "P0" in mine.stdout and other["name"] not in mine.stdout
    as_json = json.loads(_cli(url, key, "pools", "list", "--json").stdout)
    [shown] = [p for p in as_json["items"] if p["name"] == pool]
    assert [(b["priority_class"], b["ready"]) for b in shown["backlog"]] == [("P0", 1)]
    assert shown["free"] is None and shown["workers"] == 1
    assert shown == next(p for p in operator.pools.list() if p["name"] == pool)

    async def via_async() -> dict[str, Any]:
        async with AsyncClient(url, api_key=ADMIN) as admin:
            await admin.pools.update(pool, p0_reserved_share=None)
            return await admin.pools.get(pool)

    back = asyncio.run(via_async())
    assert back["p0_reserved_share"] is None and back["effective_share"] == 0.0
    default = _cli(url, ADMIN, "pools", "set", pool, "--default", "--json")
    assert default.exit_code == 0 and json.loads(default.stdout)["p0_reserved_share"] is None
