"""``cronwheel server|demo|worker|db`` run in-process by the CLI runner and stopped with
a real SIGTERM, as a process manager would."""

from __future__ import annotations

import logging
import socket
import stat
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.cli import app
from cronwheel.store.sql.core import MIGRATIONS_DIR
from cronwheel.testing import free_port, invoke_then_terminate, wait_until
from cronwheel.worker import registry

runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The commands configure logging for a terminal; put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _healthy(url: str) -> bool:
    return httpx.get(f"{url}/healthz", timeout=1).status_code == 200


def test_server_starts_migrates_prints_the_admin_key_once_and_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, Any] = {}

    def use_it() -> None:
        wait_until(lambda: _healthy(url))
        key = (data_dir / "admin.key").read_text().strip()
        with Client(url, api_key=key) as admin:
            seen["tenant"] = admin.tenants.create("from-cli-server")["name"]
        seen["key"] = key

    env = {"CRONWHEEL_ADMIN_KEY": ""}
    args = ["server", "--port", str(port), "--data-dir", str(data_dir)]
    result = invoke_then_terminate(args, use_it, env)
    assert result.exit_code == 0, result.output
    assert f"cronwheel server ready on {url}" in result.stdout
    assert (
        f"admin key (shown once, kept in {data_dir / 'admin.key'}): {seen['key']}" in result.stdout
    )
    assert "cronwheel server stopped" in result.stdout
    assert seen["tenant"] == "from-cli-server"
    assert stat.S_IMODE((data_dir / "admin.key").stat().st_mode) == 0o600
    assert (data_dir / "cronwheel.db").exists()

    # a restart keeps the key and the data, and does not print the key again
    def still_there() -> None:
        wait_until(lambda: _healthy(url))
        with Client(url, api_key=seen["key"]) as admin:
            assert [t["name"] for t in admin.tenants.list().items] == ["from-cli-server"]

    result = invoke_then_terminate(args, still_there, env)
    assert result.exit_code == 0, result.output
    assert seen["key"] not in result.stdout and "admin key: in " in result.stdout


def test_server_on_a_busy_port_fails_clearly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["server", "--port", str(port), "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


METRICS_TOKEN = "scrape-token-0123456789"


def test_scheduler_serves_its_metrics(tmp_path: Path) -> None:
    """``cronwheel scheduler --metrics-port``: the node's clock offset, clock uncertainty
    and shards held are scraped from its own port, with the metrics token or the admin
    key only."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    seen: dict[str, Any] = {}

    def scrape() -> None:
        def holds_every_shard() -> bool:
            r = httpx.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=1)
            seen["metrics"] = r.text
            return "cronwheel_scheduler_shards_held 256.0" in r.text

        wait_until(holds_every_shard)
        seen["admin"] = httpx.get(url, headers={"Authorization": "Bearer the-admin-key"}).text
        seen["refused"] = [
            httpx.get(url, headers=headers, timeout=1)
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"})
        ]
        seen["elsewhere"] = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=1)

    env = {"CRONWHEEL_METRICS_TOKEN": METRICS_TOKEN, "CRONWHEEL_ADMIN_KEY": "the-admin-key"}
    args = ["scheduler", "--data-dir", str(tmp_path), "--metrics-port", str(port)]
    result = invoke_then_terminate(args, scrape, env)
    assert result.exit_code == 0, result.output
    assert f"metrics on {url}" in result.stdout
    assert "cronwheel_scheduler_clock_offset_seconds " in seen["metrics"]
    assert "cronwheel_scheduler_clock_uncertainty_seconds " in seen["metrics"]
    assert "cronwheel_scheduler_shards_held" in seen["admin"]
    for refused in seen["refused"]:
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "unauthorized"
        assert "cronwheel_" not in refused.text
    assert seen["elsewhere"].status_code == 404
    assert seen["elsewhere"].json()["error"]["code"] == "not_found"


def test_scheduler_metrics_port_needs_a_token(tmp_path: Path) -> None:
    args = ["scheduler", "--data-dir", str(tmp_path), "--metrics-port", str(free_port())]
    result = runner.invoke(
        app, args, env={"CRONWHEEL_ADMIN_KEY": "", "CRONWHEEL_METRICS_TOKEN": ""}
    )
    assert result.exit_code == 2, result.output
    assert "CRONWHEEL_METRICS_TOKEN" in result.stderr


def test_scheduler_metrics_port_taken_fails_clearly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["scheduler", "--data-dir", str(tmp_path), "--metrics-port", str(port)]
        result = runner.invoke(app, args, env={"CRONWHEEL_METRICS_TOKEN": METRICS_TOKEN})
    assert result.exit_code == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr


def test_db_upgrade(store_url: str, tmp_path: Path) -> None:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    head = script.get_current_head()
    steps = len(list(script.walk_revisions()))
    result = runner.invoke(app, ["db", "upgrade", "--database-url", store_url])
    assert result.exit_code == 0, result.output
    assert f"already up to date at revision {head}" in result.stdout
    assert "migrated" not in result.stdout

    # An empty database: what ran, from where to where.
    fresh = tmp_path / "fresh"
    result = runner.invoke(app, ["db", "upgrade", "--data-dir", str(fresh)])
    assert result.exit_code == 0, result.output
    assert (fresh / "cronwheel.db").exists()
    assert f"from an empty database to revision {head} ({steps} migrations)" in result.stdout
    assert "up to date" not in result.stdout
    result = runner.invoke(app, ["db", "upgrade", "--data-dir", str(fresh)])
    assert f"already up to date at revision {head}" in result.stdout

    result = runner.invoke(app, ["db", "upgrade", "--database-url", "mysql://db/x"])
    assert result.exit_code == 1 and "unsupported database URL" in result.stderr
    result = runner.invoke(
        app, ["db", "upgrade", "--database-url", "postgresql://postgres:secret@127.0.0.1:1/nothing"]
    )
    assert result.exit_code == 1 and "cannot migrate" in result.stderr
    assert "secret" not in result.stderr


def test_worker_command_runs_handlers_of_the_imported_module(
    live: tuple[str, Client, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, operator, worker_key = live
    name = f"handlers_{uuid.uuid4().hex[:8]}"
    task_name = f"{name}.echo"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
        import threading
        from cronwheel.worker import task

        DONE = threading.Event()

        @task({task_name!r})
        def echo(ctx, payload):
            DONE.set()
            return {{"echo": payload, "attempt": ctx.attempt}}
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = __import__(name)
        job = operator.jobs.create(
            name="echo", schedule={"asap": True}, task=task_name, payload={"x": 1}
        )

        def handled() -> None:
            assert module.DONE.wait(30), "the handler never ran"

        args = [
            "worker",
            "--import",
            name,
            "--url",
            url,
            "--api-key",
            worker_key,
            "--concurrency",
            "2",
            "--capability",
            "python",
        ]
        result = invoke_then_terminate(args, handled)
    finally:
        registry.remove(task_name)
        sys.modules.pop(name, None)
    assert result.exit_code == 0, result.output
    assert f"tasks: {task_name}" in result.stdout
    assert "worker stopped: 1 succeeded, 0 failed, 0 released" in result.stdout
    run = operator.runs.get(job["first_run_id"])
    assert run["state"] == "SUCCESS" and run["result"] == {"echo": {"x": 1}, "attempt": 1}


def test_worker_command_errors(live: tuple[str, Client, str]) -> None:
    url, _, worker_key = live
    result = runner.invoke(
        app, ["worker", "--import", "no_such_module_cw", "--url", url, "--api-key", worker_key]
    )
    assert result.exit_code == 1 and "ModuleNotFoundError" in result.stderr

    result = runner.invoke(
        app, ["worker", "--import", "json", "--url", url, "--api-key", worker_key]
    )
    assert result.exit_code == 1 and "no handlers" in result.stderr

    result = runner.invoke(
        app, ["worker", "--import", "json", "--url", url], env={"CRONWHEEL_API_KEY": ""}
    )
    assert result.exit_code == 2 and "no API key" in result.stderr

    registry.add("cli.probe", lambda ctx, payload: None)
    try:
        result = runner.invoke(
            app, ["worker", "--import", "json", "--url", url, "--api-key", "cw_wrong"]
        )
    finally:
        registry.remove("cli.probe")
    assert result.exit_code == 1 and "invalid API key" in result.stderr


def test_demo_runs_jobs_through_its_worker(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir = tmp_path / "demo"

    def retried_and_succeeded() -> None:
        wait_until(lambda: _healthy(url))
        key = (data_dir / "admin.key").read_text().strip()
        with Client(url, api_key=key) as admin:
            tenant = wait_until(
                lambda: next((t for t in admin.tenants.list().items if t["name"] == "demo"), None)
            )
            demo = admin.with_tenant(tenant["id"])

            def flaky_recovered() -> bool:
                done = demo.runs.list(state="SUCCESS", limit=100).items
                return any(r["task"] == "demo.flaky" and r["attempt"] == 2 for r in done) and any(
                    r["task"] == "demo.hello" for r in done
                )

            wait_until(flaky_recovered, timeout=45)

    result = invoke_then_terminate(
        ["demo", "--port", str(port), "--data-dir", str(data_dir)],
        retried_and_succeeded,
        {"CRONWHEEL_ADMIN_KEY": ""},
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"cronwheel demo ready on {url}" in out and "admin key (shown once" in out
    assert "operator key: cw_" in out and "worker key:   cw_" in out
    assert "demo.flaky" in out and "cronwheel demo stopped" in out
