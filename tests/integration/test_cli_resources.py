"""``cronwheel jobs|runs|tenants …`` against a real server (API + scheduler on a free
port, on its own thread), on both backends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_server import CLI_ADMIN_KEY, Server

from cronwheel import ApiError, Client
from cronwheel.cli import app, dlq
from cronwheel.store import FailItem, create_store
from cronwheel.testing import free_port, wait_until_async


@pytest.fixture
def server(cli_server: Server) -> Server:
    return cli_server


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
        "--progress-timeout",
        "90",
    )
    assert created["name"] == "nightly" and created["task"] == "report.build"
    assert created["progress_timeout"] == 90
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
    other = server.json(
        "jobs",
        "create",
        "--name",
        "gpu",
        "--task",
        "t",
        "--delay",
        "900",
        "--pool",
        "gpu",
        "--tag",
        "a",
        "--tag",
        "b",
    )
    assert [r["id"] for r in server.json("runs", "list", "--pool", "gpu")["items"]] == [
        other["first_run_id"]
    ]
    by_tags = server.json("runs", "list", "--tag", "a", "--tag", "b")["items"]
    assert [r["id"] for r in by_tags] == [other["first_run_id"]]
    assert server.json("runs", "list", "--tag", "a", "--tag", "c")["items"] == []
    first = server.json("runs", "list", "--limit", "1")
    assert [r["id"] for r in first["items"]] == [other["first_run_id"]]  # due last
    second = server.json("runs", "list", "--limit", "1", "--cursor", first["next_cursor"])
    assert [r["id"] for r in second["items"]] == [run_id]
    due = other["next_due_at"]
    assert server.json("runs", "list", "--since", due)["items"][0]["id"] == other["first_run_id"]
    assert [r["id"] for r in server.json("runs", "list", "--until", due)["items"]] == [run_id]
    result = server.cli("runs", "list", "--pool", "gpu")
    assert result.exit_code == 0 and other["first_run_id"] in result.stdout
    assert "gpu" in result.stdout
    refused = server.cli("runs", "list", "--since", "yesterday")
    assert refused.exit_code != 0 and "--since" in refused.output
    events = server.json("runs", "events", run_id, "--limit", "1")
    assert [e["to_state"] for e in events["items"]] == ["SCHEDULED"]

    result = server.cli("runs", "cancel", run_id, "--reason", "testing")
    assert result.exit_code == 0, result.output
    assert "CANCELLED" in result.stdout

    result = server.cli("runs", "show", run_id)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"run {run_id}" in out and "attempts" in out and "events" in out
    assert "run.transition" in out and "testing" in out and "CANCELLED" in out

    detail = server.json("runs", "show", run_id)
    assert detail["state"] == "CANCELLED" and detail["attempts"] == []
    assert [e["to_state"] for e in detail["events"]] == ["SCHEDULED", "CANCELLED"]
    first = server.json("runs", "events", run_id, "--limit", "1")
    assert first["next_cursor"]
    rest = server.json("runs", "events", run_id, "--cursor", first["next_cursor"])
    assert [e["to_state"] for e in first["items"] + rest["items"]] == ["SCHEDULED", "CANCELLED"]
    result = server.cli("runs", "events", run_id)
    assert result.exit_code == 0 and "CANCELLED" in result.stdout


def test_webhook_header_values_never_reach_the_terminal(server: Server) -> None:
    secret = "Bearer cli-s3cr3t"
    with Client(server.url, api_key=server.operator_key) as client:
        job = client.jobs.create(
            name="hook",
            schedule={"delay": 600},
            webhook={"url": "https://example.com/h", "headers": {"Authorization": secret}},
        )
    assert job["webhook"]["headers"] == {"Authorization": "[redacted]"}
    run_id = job["first_run_id"]
    for args in (
        ("jobs", "show", job["id"]),
        ("jobs", "show", job["id"], "--json"),
        ("jobs", "list", "--json"),
        ("runs", "show", run_id),
        ("runs", "show", run_id, "--json"),
        ("runs", "list", "--json"),
    ):
        result = server.cli(*args)
        assert result.exit_code == 0, result.output
        assert secret not in result.output and "cli-s3cr3t" not in result.output, args
        if "show" in args:
            assert "Authorization" in result.output, args
    shown = server.json("jobs", "show", job["id"])
    assert shown["webhook"]["headers"] == {"Authorization": "[redacted]"}


def test_tenant_commands_with_the_admin_key(server: Server) -> None:
    made = server.json("tenants", "create", "cli-second", key=CLI_ADMIN_KEY)
    assert made["name"] == "cli-second" and made["api_key"].startswith("cw_")
    listed = server.json("tenants", "list", key=CLI_ADMIN_KEY)
    assert {"cli-second"} <= {t["name"] for t in listed["items"]}
    key = server.json("tenants", "create-key", made["id"], "--role", "viewer", key=CLI_ADMIN_KEY)
    assert key["role"] == "viewer"

    # the admin key reaches a tenant's jobs when it names the tenant
    result = server.cli("jobs", "list", key=CLI_ADMIN_KEY)
    assert result.exit_code == 2 and "Cronwheel-Tenant" not in result.stderr
    assert "--tenant" in result.stderr and "CRONWHEEL_TENANT" in result.stderr
    result = server.cli("jobs", "list", "--tenant", made["id"], key=CLI_ADMIN_KEY)
    assert result.exit_code == 0, result.output


def test_errors_are_clear_and_change_nothing(server: Server) -> None:
    create = ("jobs", "create", "--name", "e", "--task", "t")

    result = server.cli(*create, "--delay", "5", key="cw_wrong-key")
    assert result.exit_code == 1
    assert "invalid API key" in result.stderr and "--api-key" in result.stderr

    result = server.cli(*create, "--delay", "5", CRONWHEEL_URL=f"http://127.0.0.1:{free_port()}")
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
    result = server.cli(*create, "--asap", "--progress-timeout", "0")
    assert result.exit_code == 1 and "progress_timeout" in result.stderr

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

        async def dispatched() -> list[Any]:
            leased = await store.attempts_lease(worker=worker, max=10)
            return [a for a in leased if str(a.run_id) == run_id]

        [attempt] = await wait_until_async(dispatched, 30, what="dispatch", interval=0.05)
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


async def _dead_letters(server: Server, store_url: str, count: int) -> list[str]:
    """``count`` jobs due now with one try each, whose runs the server's scheduler
    dispatches and a worker fails: dead letters, in id order."""
    runs = {
        server.json(
            "jobs", "create", "--name", f"bulk-{i}", "--task", "t", "--asap", "--max-attempts", "1"
        )["first_run_id"]
        for i in range(count)
    }
    store = create_store(store_url)
    await store.open()
    try:
        tenant = uuid.UUID(server.tenant_id)
        worker = await store.workers_register(
            tenant, pool="default", capabilities=[], tags=[], capacity=count
        )
        leased: list[Any] = []

        async def all_dispatched() -> bool:
            leased.extend(await store.attempts_lease(worker=worker, max=count))
            return len(leased) >= count

        await wait_until_async(all_dispatched, 30, what="dispatch", interval=0.05)
        assert {str(a.run_id) for a in leased} == runs
        await store.attempts_fail_many(
            items=[FailItem(a.attempt_id, a.fencing_token, "disk full") for a in leased]
        )
    finally:
        await store.close()
    return sorted(runs, key=uuid.UUID)


def _dead_ids(server: Server) -> list[str]:
    return sorted((r["id"] for r in server.json("dlq", "list")["items"]), key=uuid.UUID)


async def test_dlq_redrive_in_bulk(
    server: Server, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = await _dead_letters(server, store_url, 5)

    # Refused before anything is sent: nothing changes.
    for args, code, words in (
        ((), 2, "exactly one of them"),
        ((dead[0], "--all"), 2, "got run ids and --all"),
        (("--job", dead[0], "--all", "--yes"), 2, "got --job and --all"),
        (("--all",), 2, "add --yes"),
        (("--all", "--yes", "--limit", "0"), 2, "--limit"),
        ((dead[0], "not-a-run"), 1, "run_ids.1"),
        (("--job", "not-a-job"), 1, "job_id"),
        (("--job", str(uuid.uuid4())), 1, "not found"),
    ):
        result = server.cli("dlq", "redrive", *args)
        assert result.exit_code == code, (args, result.output)
        assert words in result.stderr, (args, result.stderr)
    assert _dead_ids(server) == dead

    # Several ids: a table of what was sent back and skipped; the skip exits 1.
    unknown = str(uuid.uuid4())
    result = server.cli("dlq", "redrive", dead[0], unknown, "--reason", "disk replaced")
    assert result.exit_code == 1, result.output
    assert "redriven 1, skipped 1" in result.stdout
    lines = result.stdout.splitlines()
    assert any(dead[0] in line and "redriven" in line for line in lines)
    assert any(unknown in line and "not found" in line for line in lines)
    assert "1 of the runs named were not sent back" in result.stderr
    # Sent back (the server's scheduler may have fired it already).
    events = server.json("runs", "show", dead[0])["events"]
    [sent] = [e for e in events if e["from_state"] == "DEAD_LETTER"]
    assert (sent["to_state"], sent["reason"]) == ("SCHEDULED", "disk replaced")

    job_id = server.json("runs", "show", dead[1])["job_id"]
    out = server.json("dlq", "redrive", "--job", job_id)
    assert out == {"redriven": 1, "run_ids": [dead[1]], "skipped": [], "more": False}

    # The blocking client.
    with Client(server.url, api_key=server.operator_key) as client:
        out = client.runs.redrive_many([dead[4], dead[0]], reason="sync")
        assert out["run_ids"] == [dead[4]]
        [skipped] = out["skipped"]
        assert skipped["run_id"] == dead[0]
        assert skipped["reason"].startswith("not a dead letter: ")
        with pytest.raises(ApiError) as caught:
            client.runs.redrive_many(job_id=job_id, all=True)
        assert (caught.value.status, caught.value.field) == (422, "all")
    assert _dead_ids(server) == dead[2:4]

    # --all, oldest first, at most --limit; the rest are still there.
    result = server.cli("dlq", "redrive", "--all", "--yes", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert dead[2] in result.stdout and dead[3] not in result.stdout
    assert "more dead letters match" in result.stdout
    assert _dead_ids(server) == [dead[3]]

    # At a terminal --all asks first.
    monkeypatch.setattr(dlq, "_interactive", lambda: True)
    result = server.cli("dlq", "redrive", "--all", input="n\n")
    assert result.exit_code == 1 and "Send back every dead letter" in result.output
    assert _dead_ids(server) == [dead[3]]
    result = server.cli("dlq", "redrive", "--all", input="y\n")
    assert result.exit_code == 0 and dead[3] in result.stdout
    assert _dead_ids(server) == []

    result = server.cli("dlq", "redrive", "--all", "--yes")
    assert result.exit_code == 0 and "nothing sent back" in result.stdout
