"""The webhook commands end to end: `cronwheel server` calling a webhook job's URL, and
`cronwheel worker --webhook` against a running server, with a real HTTP receiver on
127.0.0.1 that the allow-list admits."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner
from webhook_checks import verify

from cronwheel import Client
from cronwheel.cli import app as cli
from cronwheel.client import Call
from cronwheel.testing import free_port, invoke_then_terminate, wait_until

pytestmark = pytest.mark.usefixtures("only_loopback_traffic")


# -- the commands ---------------------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def _restore_logging() -> Iterator[None]:
    """The commands configure logging for a terminal; put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class _SyncReceiver:
    """A real HTTP endpoint on its own thread, for tests of blocking commands."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.got = threading.Event()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                received.requests.append((self.path, headers, body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                received.got.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _SyncReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _secret(client: Client, tenant_id: str) -> str:
    return str(
        client.send(Call("GET", f"/v1/tenants/{tenant_id}/webhook-secret"))["webhook_secret"]
    )


@pytest.mark.usefixtures("_restore_logging")
def test_cronwheel_server_runs_a_webhook_job_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, Any] = {}
    with _SyncReceiver() as receiver:

        def webhook_called() -> None:
            wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200)
            with Client(url, api_key="adm-webhooks") as admin:
                tenant = admin.tenants.create("hooks-e2e")
            with Client(url, api_key=tenant["api_key"]) as operator:
                job = operator.jobs.create(
                    name="e2e",
                    schedule={"asap": True},
                    webhook={"url": f"{receiver.url}/e2e"},
                    payload={"n": 1},
                )
                assert receiver.got.wait(30), "the webhook was never called"
                seen["run"] = wait_until(
                    lambda: (
                        (r := operator.runs.get(job["first_run_id"]))["state"] == "SUCCESS" and r
                    )
                )
                seen["secret"] = _secret(operator, tenant["id"])

        env = {
            "CRONWHEEL_ADMIN_KEY": "adm-webhooks",
            "CRONWHEEL_WEBHOOK_ALLOW": "127.0.0.1/32",
            "CRONWHEEL_WEBHOOK_POOLS": "default",
        }
        result = invoke_then_terminate(
            ["server", "--port", str(port), "--data-dir", str(tmp_path)], webhook_called, env
        )
    assert result.exit_code == 0, result.output
    [(path, headers, body)] = receiver.requests
    assert path == "/e2e" and json.loads(body) == {"n": 1}
    assert verify(seen["secret"], headers, body)
    assert headers["cronwheel-run-id"] == seen["run"]["id"]
    assert seen["run"]["result"] == {"status": 200, "body": "ok", "truncated": False}


@pytest.mark.usefixtures("_restore_logging")
def test_the_worker_command_calls_webhooks(live: tuple[str, Client, str]) -> None:
    url, operator, worker_key = live
    with _SyncReceiver() as receiver:
        job = operator.jobs.create(
            name="cli", schedule={"asap": True}, webhook={"url": f"{receiver.url}/cli"}
        )

        def called() -> None:
            assert receiver.got.wait(30), "the webhook was never called"
            wait_until(lambda: operator.runs.get(job["first_run_id"])["state"] == "SUCCESS")

        args = ["worker", "--webhook", "--allow", "127.0.0.1/32", "--url", url]
        result = invoke_then_terminate([*args, "--api-key", worker_key], called)
    assert result.exit_code == 0, result.output
    assert "webhooks" in result.stdout
    assert "worker stopped: 1 succeeded, 0 failed, 0 released" in result.stdout
    [(path, headers, _)] = receiver.requests
    assert path == "/cli" and headers["cronwheel-attempt"] == "1"


def test_the_worker_command_errors(live: tuple[str, Client, str]) -> None:
    url, _, worker_key = live
    result = runner.invoke(cli, ["worker", "--url", url, "--api-key", worker_key])
    assert result.exit_code == 2 and "nothing to run" in result.stderr
    result = runner.invoke(
        cli, ["worker", "--webhook", "--allow", "10.0.0.0/33", "--url", url, "--api-key", "k"]
    )
    assert result.exit_code == 1 and "'10.0.0.0/33' is neither a network" in result.stderr
    result = runner.invoke(
        cli, ["worker", "--import", "json", "--allow", "10.0.0.0/8", "--api-key", "k"]
    )
    assert result.exit_code == 2 and "--allow applies to webhooks" in result.stderr
