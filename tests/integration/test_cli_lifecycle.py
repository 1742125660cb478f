"""``cronwheel jobs delete``, ``cronwheel tenants delete`` and ``cronwheel jobs create
--webhook`` / ``--start`` against a real server, on both backends."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from answers import parse
from cli_server import CLI_ADMIN_KEY, Server

from cronwheel.cli import app
from cronwheel.store import CompleteItem, Store, create_store
from cronwheel.testing import wait_until_async


async def _running(cli_server: Server, store_url: str, job_id: str) -> tuple[Store, Any]:
    """The job's run, dispatched by the server's scheduler and leased by a worker (made
    through the store): RUNNING. The store is open; the caller closes it."""
    store = create_store(store_url)
    await store.open()
    tenant = uuid.UUID(cli_server.tenant_id)
    worker = await store.workers_register(
        tenant, pool="default", capabilities=[], tags=[], capacity=1
    )

    async def leased() -> list[Any]:
        got = await store.attempts_lease(worker=worker, max=1)
        return [a for a in got if str(a.job_id) == job_id]

    [attempt] = await wait_until_async(leased, 30, what="dispatch", interval=0.05)
    return store, attempt


async def test_jobs_delete(cli_server: Server, store_url: str) -> None:
    idle = cli_server.json("jobs", "create", "--name", "idle", "--task", "t", "--delay", "3600")
    result = cli_server.cli("jobs", "delete", idle["id"], "--reason", "not needed")
    assert result.exit_code == 0, result.output
    assert f"deleted job {idle['id']} (idle) with 1 run" in result.stdout
    result = cli_server.cli("jobs", "show", idle["id"])
    assert result.exit_code == 1 and "not_found" in result.stderr

    busy = cli_server.json("jobs", "create", "--name", "busy", "--task", "t", "--asap")
    store, attempt = await _running(cli_server, store_url, busy["id"])
    try:
        result = cli_server.cli("jobs", "delete", busy["id"])
        assert result.exit_code == 1 and result.stdout == ""
        assert "[in_use]" in result.stderr and str(attempt.run_id) in result.stderr
        assert "RUNNING" in result.stderr and "--force ends" in result.stderr
        assert cli_server.json("runs", "show", str(attempt.run_id))["state"] == "RUNNING"

        out = cli_server.json("jobs", "delete", busy["id"], "--force")
        assert out["runs_stopped"] == [{"id": str(attempt.run_id), "state": "RUNNING"}]
        [done] = await store.attempts_complete_many(
            items=[CompleteItem(attempt.attempt_id, attempt.fencing_token)],
            tenant_id=uuid.UUID(cli_server.tenant_id),
        )
        assert done.error_code == "stale_fencing_token"
    finally:
        await store.close()

    result = cli_server.cli("jobs", "delete", str(uuid.uuid4()))
    assert result.exit_code == 1 and "not_found" in result.stderr
    assert cli_server.json("jobs", "list")["items"] == []


def test_tenants_delete_by_name(cli_server: Server) -> None:
    made = cli_server.json("tenants", "create", "leaving", key=CLI_ADMIN_KEY)
    key = made["api_key"]
    job = cli_server.json("jobs", "create", "--name", "j", "--task", "t", "--delay", "60", key=key)

    result = cli_server.cli("tenants", "delete", "leaving", key=CLI_ADMIN_KEY)
    assert result.exit_code == 1 and "[in_use]" in result.stderr and job["id"] in result.stderr
    result = cli_server.cli("tenants", "delete", "leaving", key=key)
    assert result.exit_code == 1 and "admin key" in result.stderr
    result = cli_server.cli("tenants", "delete", "nobody-by-that-name", key=CLI_ADMIN_KEY)
    assert result.exit_code == 1 and "no tenant named" in result.stderr
    assert cli_server.json("jobs", "list", key=key)["items"][0]["id"] == job["id"]

    result = cli_server.cli("tenants", "delete", "leaving", "--force", key=CLI_ADMIN_KEY)
    assert result.exit_code == 0, result.output
    assert f"deleted tenant {made['id']} (leaving) with 1 job, 1 run, 1 API key" in result.stdout
    result = cli_server.cli("jobs", "list", key=key)
    assert result.exit_code == 1 and "invalid API key" in result.stderr
    names = [t["name"] for t in cli_server.json("tenants", "list", key=CLI_ADMIN_KEY)["items"]]
    assert "leaving" not in names
    result = cli_server.cli("tenants", "delete", made["id"], key=CLI_ADMIN_KEY)
    assert result.exit_code == 1 and "not_found" in result.stderr


def test_jobs_create_webhook(cli_server: Server) -> None:
    secret = "Bearer hook-s3cr3t"
    job = cli_server.json(
        "jobs",
        "create",
        "--name",
        "hook",
        "--webhook",
        "https://example.com/run",
        "--header",
        f"Authorization={secret}",
        "--header",
        "X-Team=ops=eu",
        "--method",
        "PUT",
        "--delay",
        "3600",
    )
    assert job["task"] is None and "webhook" in job["requires"]
    assert job["webhook"]["url"] == "https://example.com/run"
    assert job["webhook"]["method"] == "PUT"
    assert job["webhook"]["headers"] == {"Authorization": "[redacted]", "X-Team": "[redacted]"}
    result = cli_server.cli("jobs", "list")
    assert "webhook" in result.stdout and "hook-s3cr3t" not in result.output

    default = cli_server.json(
        "jobs", "create", "--name", "plain", "--webhook", "https://example.com/p", "--asap"
    )
    assert default["webhook"]["method"] == "POST" and default["webhook"]["headers"] == {}

    base = ("jobs", "create", "--name", "bad", "--delay", "60")
    for args, code, words in (
        (("--task", "t", "--webhook", "https://example.com/x"), 2, "exactly one of --task"),
        ((), 2, "exactly one of --task or --webhook"),
        (("--task", "t", "--header", "A=b"), 2, "applies to --webhook only"),
        (("--task", "t", "--method", "GET"), 2, "applies to --webhook only"),
        (("--webhook", "https://example.com/x", "--header", "novalue"), 2, "NAME=VALUE"),
        (("--webhook", "https://example.com/x", "--method", "BREW"), 2, "BREW"),
        (("--webhook", "not a url"), 1, "webhook.url"),
        (("--webhook", "https://example.com/x", "--header", "Host=evil"), 1, "webhook.headers"),
    ):
        result = cli_server.cli(*base, *args)
        assert result.exit_code == code, (args, result.output)
        assert words in result.stderr, (args, result.stderr)
    assert {j["name"] for j in cli_server.json("jobs", "list")["items"]} == {"hook", "plain"}


def test_every_is_anchored_to_the_epoch_or_to_start(cli_server: Server) -> None:
    epoch = cli_server.json("jobs", "create", "--name", "e", "--task", "t", "--every", "60")
    assert epoch["schedule"].get("start") is None
    first = parse(epoch["next_due_at"])
    assert (first.second, first.microsecond) == (0, 0)  # at a minute's start, UTC

    start = "2026-01-01T00:00:30Z"  # past: the next interval counted from it
    job = cli_server.json(
        "jobs", "create", "--name", "s", "--task", "t", "--every", "60", "--start", start
    )
    assert job["schedule"]["start"].startswith("2026-01-01T00:00:30")
    due = [
        item["due_at"] for item in cli_server.json("jobs", "preview", job["id"], "-n", "3")["items"]
    ]
    instants = [parse(d) for d in due]
    assert [i.second for i in instants] == [30, 30, 30]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(instants)] == [60, 60]
    assert parse(job["next_due_at"]) == instants[0]

    result = cli_server.cli(
        "jobs", "create", "--name", "x", "--task", "t", "--every", "60", "--start", "soon"
    )
    assert result.exit_code == 2 and "--start" in result.stderr
    result = cli_server.cli(
        "jobs", "create", "--name", "x", "--task", "t", "--asap", "--start", start
    )
    assert result.exit_code == 2 and "--start does not apply to --asap" in result.stderr
    assert {j["name"] for j in cli_server.json("jobs", "list")["items"]} == {"e", "s"}


def test_tables_to_a_pipe_keep_each_row_on_one_line(cli_server: Server) -> None:
    made = [
        cli_server.json("jobs", "create", "--name", f"n{i}", "--task", "t", "--delay", "600")
        for i in range(2)
    ]
    # Not a terminal and no COLUMNS: no width to fold the ids to.
    result = cli_server.runner.invoke(
        app,
        ["jobs", "list"],
        env={"CRONWHEEL_URL": cli_server.url, "CRONWHEEL_API_KEY": cli_server.operator_key},
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for job in made:
        [row] = [line for line in lines if job["id"] in line]
        assert job["name"] in row and "delay 600 s" in row and "default" in row
    assert max(len(line) for line in lines) > 80  # wider than the default of 80 columns
