"""``cronwheel jobs|runs|tenants …`` against a real server (API + scheduler on a free
port, on its own thread), on both backends."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.cli import app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import FailItem, create_store

ADMIN_KEY = "cli-admin-key"


@dataclass
class Server:
    url: str
    operator_key: str
    tenant_id: str
    runner: CliRunner

    def cli(self, *args: str, key: str | None = None, **env: str) -> Result:
        """``cronwheel <args>`` with the URL and key in the environment, as users set them."""
        environ = {
            "CRONWHEEL_URL": self.url,
            "CRONWHEEL_API_KEY": key or self.operator_key,
            "COLUMNS": "200",
            **env,
        }
        return self.runner.invoke(app, list(args), env=environ)

    def json(self, *args: str, key: str | None = None) -> Any:
        result = self.cli(*args, "--json", key=key)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[Server]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings)) as running,
        Client(running.url, api_key=ADMIN_KEY) as admin,
    ):
        tenant = admin.tenants.create(f"cli-{uuid.uuid4().hex[:6]}")
        yield Server(running.url, tenant["api_key"], tenant["id"], CliRunner())


def test_jobs_create_list_and_cancel(server: Server) -> None:
    created = server.json(
        "jobs",
        "create",
        "--name",
        "nightly",
        "--task",
        "report.build",
        "--delay",
        "3600",
        "--payload",
        '{"region": "eu"}',
        "--pool",
        "reports",
        "--priority",
        "1",
        "--tag",
        "billing",
        "--max-attempts",
        "5",
    )
    assert created["name"] == "nightly" and created["task"] == "report.build"
    assert created["payload"] == {"region": "eu"} and created["pool"] == "reports"
    assert created["priority"] == 1 and created["tags"] == ["billing"]
    assert created["retry"]["max_attempts"] == 5 and created["state"] == "active"

    result = server.cli("jobs", "list")
    assert result.exit_code == 0, result.output
    assert "nightly" in result.stdout and created["id"] in result.stdout
    assert "delay 3600 s" in result.stdout and "report.build" in result.stdout

    listed = server.json("jobs", "list", "--tag", "billing")
    assert [j["id"] for j in listed["items"]] == [created["id"]]
    assert server.json("jobs", "list", "--name-prefix", "other")["items"] == []

    result = server.cli("jobs", "cancel", created["id"], "--reason", "not tonight")
    assert result.exit_code == 0, result.output
    assert f"cancelled job {created['id']}" in result.stdout
    assert server.json("jobs", "show", created["id"])["state"] == "cancelled"

    result = server.cli("jobs", "cancel", created["id"])
    assert result.exit_code == 1
    assert "illegal_transition" in result.stderr and result.stdout == ""


def test_jobs_create_at_and_asap_and_idempotency(server: Server) -> None:
    at = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    job = server.json(
        "jobs",
        "create",
        "--name",
        "later",
        "--task",
        "t",
        "--at",
        at.isoformat().replace("+00:00", "Z"),
    )
    assert datetime.fromisoformat(job["next_due_at"].replace("Z", "+00:00")) == at

    first = server.json(
        "jobs", "create", "--name", "now", "--task", "t", "--asap", "--idempotency-key", "once"
    )
    again = server.json(
        "jobs", "create", "--name", "now", "--task", "t", "--asap", "--idempotency-key", "once"
    )
    assert first["id"] == again["id"]

    result = server.cli("jobs", "create", "--name", "x", "--task", "t", "--delay", "5")
    assert result.exit_code == 0 and "created job" in result.stdout and "run " in result.stdout


def test_runs_list_and_show(server: Server) -> None:
    job = server.json("jobs", "create", "--name", "soon", "--task", "t", "--delay", "600")
    run_id = job["first_run_id"]

    result = server.cli("runs", "list", "--job-id", job["id"])
    assert result.exit_code == 0, result.output
    assert run_id in result.stdout and "SCHEDULED" in result.stdout

    assert server.json("runs", "list", "--state", "SCHEDULED")["items"][0]["id"] == run_id
    assert server.json("runs", "list", "--state", "SUCCESS,FAILED")["items"] == []

    result = server.cli("runs", "cancel", run_id, "--reason", "testing")
    assert result.exit_code == 0 and "CANCELLED" in result.stdout

    result = server.cli("runs", "show", run_id)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"run {run_id}" in out and "attempts" in out and "events" in out
    assert "run.transition" in out and "testing" in out and "CANCELLED" in out

    detail = server.json("runs", "show", run_id)
    assert detail["state"] == "CANCELLED" and detail["attempts"] == []
    assert [e["to_state"] for e in detail["events"]] == ["SCHEDULED", "CANCELLED"]


def test_tenant_commands_with_the_admin_key(server: Server) -> None:
    made = server.json("tenants", "create", "cli-second", key=ADMIN_KEY)
    assert made["name"] == "cli-second" and made["api_key"].startswith("cw_")
    listed = server.json("tenants", "list", key=ADMIN_KEY)
    assert {"cli-second"} <= {t["name"] for t in listed["items"]}
    key = server.json("tenants", "create-key", made["id"], "--role", "viewer", key=ADMIN_KEY)
    assert key["role"] == "viewer"

    # the admin key reaches a tenant's jobs when it names the tenant
    result = server.cli("jobs", "list", key=ADMIN_KEY)
    assert result.exit_code == 1 and "Cronwheel-Tenant" in result.stderr
    result = server.cli("jobs", "list", "--tenant", made["id"], key=ADMIN_KEY)
    assert result.exit_code == 0, result.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_errors_are_clear_and_change_nothing(server: Server) -> None:
    create = ("jobs", "create", "--name", "e", "--task", "t")

    result = server.cli(*create, "--delay", "5", key="cw_wrong-key")
    assert result.exit_code == 1
    assert "invalid API key" in result.stderr and "--api-key" in result.stderr

    result = server.cli(*create, "--delay", "5", CRONWHEEL_URL=f"http://127.0.0.1:{_free_port()}")
    assert result.exit_code == 1 and "cannot reach" in result.stderr
    assert "is the server running?" in result.stderr

    result = server.cli(*create, "--delay", "5", CRONWHEEL_URL="localhost:8000")
    assert result.exit_code == 2 and "http(s) URL" in result.stderr

    result = server.cli(*create, "--at", "tomorrow")
    assert result.exit_code == 2 and "not an ISO-8601 instant" in result.stderr
    result = server.cli(*create, "--at", "2031-01-01T09:00:00")
    assert result.exit_code == 2 and "no UTC offset" in result.stderr
    result = server.cli(*create, "--delay", "5", "--asap")
    assert result.exit_code == 2 and "exactly one of --at, --delay, --asap" in result.stderr
    result = server.cli(*create)
    assert result.exit_code == 2 and "exactly one of" in result.stderr
    result = server.cli(*create, "--asap", "--payload", "[1, 2]")
    assert result.exit_code == 2 and "JSON object" in result.stderr
    result = server.cli(*create, "--asap", "--payload", "{oops")
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    result = server.cli(*create, "--asap", "--priority", "7")
    assert result.exit_code == 2

    # refused by the server: the message names the field
    result = server.cli(*create, "--at", "2001-01-01T00:00:00Z")
    assert result.exit_code == 1 and "schedule.at" in result.stderr

    result = server.runner.invoke(
        app, ["jobs", "list"], env={"CRONWHEEL_URL": server.url, "CRONWHEEL_API_KEY": ""}
    )
    assert result.exit_code == 2 and "no API key" in result.stderr

    assert server.json("jobs", "list")["items"] == []


# -- dead letters ------------------------------------------------------------------


async def _dead_letter(server: Server, store_url: str) -> str:
    job = server.json(
        "jobs",
        "create",
        "--name",
        "flaky",
        "--task",
        "t",
        "--delay",
        "3600",
        "--max-attempts",
        "1",
    )
    run_id = job["first_run_id"]
    store = create_store(store_url)
    await store.open()
    try:
        tenant = uuid.UUID(server.tenant_id)
        await store.runs_cancel(tenant, uuid.UUID(run_id))  # then retried through the CLI
        retried = server.json("runs", "retry", run_id)
        assert retried["state"] == "SCHEDULED"
        # Make it a dead letter the way a worker would: once the server's scheduler has
        # dispatched it (the retry made it due now), lease it and fail its only try.
        worker = await store.workers_register(
            tenant, pool="default", capabilities=[], tags=[], capacity=1
        )
        deadline = asyncio.get_running_loop().time() + 30
        leased: list[Any] = []
        while not leased:
            assert asyncio.get_running_loop().time() < deadline, "never dispatched"
            leased = [
                a
                for a in await store.attempts_lease(worker=worker, max=10)
                if str(a.run_id) == run_id
            ]
            if not leased:
                await asyncio.sleep(0.05)
        [attempt] = leased
        await store.attempts_fail_many(
            items=[FailItem(attempt.attempt_id, attempt.fencing_token, "disk full")]
        )
    finally:
        await store.close()
    return run_id


async def test_dlq_list_show_redrive(server: Server, store_url: str) -> None:
    run_id = await _dead_letter(server, store_url)
    listed = server.cli("dlq", "list")
    assert listed.exit_code == 0, listed.output
    assert run_id in listed.output and "disk full" in listed.output
    shown = server.cli("dlq", "show", run_id)
    assert shown.exit_code == 0 and "DEAD_LETTER" in shown.output
    redriven = server.json("dlq", "redrive", run_id)
    assert redriven["state"] == "SCHEDULED"
    assert server.json("dlq", "list")["items"] == []
    again = server.cli("dlq", "redrive", run_id)
    assert again.exit_code == 1 and "illegal_transition" in (again.output + again.stderr)
