"""``ctx.log`` reaches the server: real handlers log, and the lines come back from
``GET /v1/runs/{id}/logs`` and ``cronwheel runs logs``, in order, sent before each
attempt's outcome. The shipper's own rules (memory bound, 409, the outcome's wait)
are checked against a stand-in for the server's log endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from typer.testing import CliRunner

from cronwheel import ApiError, AsyncClient, Client
from cronwheel.api import create_app
from cronwheel.cli import app as cli_app
from cronwheel.client import ApiConnectionError
from cronwheel.runtime import BackgroundRuntime, Runtime, serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import LogShipConfig, TaskContext, Worker
from cronwheel.worker.logship import LogShipper
from cronwheel.worker.protocol import LogsAppended, WorkerProtocol
from cronwheel.worker.tasks import RunLogAdapter

ALL_SHARDS = range(256)
FAST_RETRY = {"max_attempts": 3, "initial_delay": 0, "jitter": "none"}
QUICK = LogShipConfig(flush_interval=0.05)


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The real transport, remembering each request's path and JSON body in order."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        return await super().handle_async_request(request)


@dataclass
class Env:
    url: str
    store: Store
    operator: AsyncClient
    worker_key: str
    transports: list[RecordingTransport] = field(default_factory=list)

    async def job(self, task: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("schedule", {"asap": True})
        fields.setdefault("name", f"job-{uuid.uuid4().hex[:6]}")
        return await self.operator.jobs.create(task=task, **fields)

    async def fire(self) -> int:
        await self.store.shard_leases_acquire(node_id="t", shards=ALL_SHARDS, ttl=60)
        now = await self.store.db_now()
        due = await self.store.runs_due_scan(shards=ALL_SHARDS, until=now + timedelta(seconds=1))
        return len(await self.store.runs_fire(run_ids=[d.id for d in due], node_id="t"))

    def worker(self, **kwargs: Any) -> tuple[Worker, RecordingTransport]:
        transport = RecordingTransport()
        kwargs.setdefault("lease_wait", 1.0)
        worker = Worker(self.url, api_key=self.worker_key, transport=transport, **kwargs)
        return worker, transport

    async def lines(self, run_id: str, **kwargs: Any) -> list[dict[str, Any]]:
        return [line async for line in self.operator.runs.logs(run_id, **kwargs)]


@pytest.fixture(params=["files", "database"])
def log_kind(request: pytest.FixtureRequest) -> str:
    """Where the server keeps the lines: both log stores hold the same contract."""
    return str(request.param)


@pytest.fixture
async def env(settings: Settings, store: Store, log_kind: str) -> AsyncIterator[Env]:
    assert settings.admin_key is not None
    settings = settings.model_copy(update={"log_store": log_kind})
    async with (
        serving(create_app(settings, store)) as url,
        AsyncClient(url, api_key=settings.admin_key) as admin,
    ):
        tenant = await admin.tenants.create(f"logs-{uuid.uuid4().hex[:6]}")
        key = await admin.tenants.create_key(tenant["id"], role="worker")
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            yield Env(url, store, operator, key["api_key"])


async def within(aw: Awaitable[Any], seconds: float = 30.0) -> Any:
    async with asyncio.timeout(seconds):
        return await aw


# -- through the real API ----------------------------------------------------------------


async def test_a_handlers_lines_come_back_in_order(env: Env) -> None:
    job = await env.job("chatty", retry=FAST_RETRY)
    run_id = job["first_run_id"]
    worker, _transport = env.worker()

    @worker.task("chatty")
    async def chatty(ctx: TaskContext, payload: dict[str, Any]) -> str:
        ctx.log.debug("debug is not shipped")
        for step in range(3):
            ctx.log.info("step %d of %s", step, "three")
        if ctx.attempt == 1:
            try:
                raise ValueError("boom")
            except ValueError:
                ctx.log.exception("caught something")
            raise RuntimeError("first try fails")
        ctx.log.warning("second try done")
        return "ok"

    for _ in range(2):
        assert await env.fire() == 1
        await within(worker.run_async(drain=True))
    assert (await env.operator.runs.get(run_id))["state"] == "SUCCESS"

    lines = await env.lines(run_id)
    steps = [("INFO", f"step {i} of three") for i in range(3)]
    first = [(line["level"], line["message"]) for line in lines if line["attempt"] == 1]
    assert first[:3] == steps
    level, caught = first[3]
    assert level == "ERROR" and caught.startswith("caught something\nTraceback")
    assert "ValueError: boom" in caught
    # The session's own line about the failure is shipped too: it goes before the outcome.
    level, failed = first[4]
    assert level == "WARNING" and "failed in" in failed and "first try fails" in failed
    assert len(first) == 5
    second = [(line["level"], line["message"]) for line in lines if line["attempt"] == 2]
    assert second == [*steps, ("WARNING", "second try done")]
    assert [line["attempt"] for line in lines] == [1] * 5 + [2] * 4  # attempts in order
    assert not any("debug" in line["message"] for line in lines)

    only = await env.lines(run_id, attempt=2)
    assert [line["message"] for line in only] == [m for _level, m in second]


async def test_a_thread_handlers_many_lines_all_arrive_before_the_outcome(env: Env) -> None:
    job = await env.job("loud")
    run_id = job["first_run_id"]
    assert await env.fire() == 1
    worker, transport = env.worker()

    @worker.task("loud")
    def loud(ctx: TaskContext, payload: dict[str, Any]) -> None:
        for i in range(1200):  # more than two batches
            ctx.log.info("line %04d", i)

    await within(worker.run_async(drain=True))
    assert (await env.operator.runs.get(run_id))["state"] == "SUCCESS"
    assert [line["message"] for line in await env.lines(run_id)] == [
        f"line {i:04d}" for i in range(1200)
    ]

    paths = [path for path, _body in transport.requests]
    log_posts = [i for i, path in enumerate(paths) if path.endswith("/logs")]
    completed = [
        i
        for i, (path, body) in enumerate(transport.requests)
        if path == "/v1/attempts/batch" and body["completions"]
    ]
    assert len(log_posts) >= 3 and len(completed) == 1
    assert max(log_posts) < completed[0]  # every line went before the outcome


async def test_a_lost_lease_drops_the_attempts_later_lines(env: Env) -> None:
    job = await env.job("slow")
    run_id = job["first_run_id"]
    assert await env.fire() == 1
    worker, transport = env.worker(log_shipping=QUICK)
    gate = threading.Event()

    @worker.task("slow")
    def slow(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.log.info("before")
        gate.wait(30)
        ctx.log.info("after the lease was lost")

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    try:
        await wait_until_async(lambda: _has_line(env, run_id, "before"), 20, not_yet=())
        # The lease expires behind the worker's back: the run is retried elsewhere.
        later = await env.store.db_now() + timedelta(hours=1)
        assert await env.store.attempts_expire(now=later) == 1
        gate.set()
        await wait_until_async(lambda: worker.held == 0 and worker.running == 0)
        # The late line was offered and refused (409): nothing more was written.
        await wait_until_async(
            lambda: any(body and "after" in str(body) for _p, body in transport.requests)
        )
        assert [line["message"] for line in await env.lines(run_id)] == ["before"]
    finally:
        gate.set()
        stop.set()
        await within(running)


async def _has_line(env: Env, run_id: str, message: str) -> bool:
    return any(line["message"] == message for line in await env.lines(run_id))


# -- the shipper's rules, against a stand-in log endpoint ---------------------------------


class FakeLogs:
    """The log endpoint of a server that can be down, or refuse the attempt."""

    def __init__(self) -> None:
        self.up = False
        self.refuse = False
        self.calls = 0
        self.sent: list[tuple[str, int, list[dict[str, Any]]]] = []

    async def append_logs(
        self, attempt_id: str, *, fencing_token: int, lines: Sequence[dict[str, Any]]
    ) -> LogsAppended:
        self.calls += 1
        if not self.up:
            raise ApiConnectionError("cannot reach the server")
        if self.refuse:
            raise ApiError(409, "stale_fencing_token", "stale fencing token")
        self.sent.append((attempt_id, fencing_token, list(lines)))
        return LogsAppended(accepted=len(lines), dropped=0)

    def messages(self) -> list[str]:
        return [line["message"] for _a, _t, lines in self.sent for line in lines]


@contextlib.asynccontextmanager
async def shipping(fake: FakeLogs, **config: Any) -> AsyncIterator[LogShipper]:
    config.setdefault("flush_interval", 0.02)
    config.setdefault("backoff_max", 0.05)
    shipper = LogShipper(cast(WorkerProtocol, fake), LogShipConfig(**config))
    shipper.start()
    try:
        yield shipper
    finally:
        await shipper.close()


def ctx_log(shipper: LogShipper, attempt_id: str = "a-1", token: int = 7) -> RunLogAdapter:
    extra = {"run_id": "r-1", "attempt_id": attempt_id, "attempt": 1, "task": "t"}
    return shipper.adapter(logging.getLogger("cronwheel.task"), extra, fencing_token=token)


async def test_memory_is_bounded_while_the_server_is_out_of_reach() -> None:
    fake = FakeLogs()
    async with shipping(fake, max_buffered_lines=5) as shipper:
        log = ctx_log(shipper)
        for i in range(8):
            log.info("line %d", i)
        assert shipper.dropped == 3  # the oldest, at once
        await wait_until_async(lambda: fake.calls >= 2)  # tried, failed, tried again
        fake.up = True
        reported = asyncio.Event()
        shipper.then("a-1", reported.set)
        await within(reported.wait())
        assert fake.messages()[0].startswith("3 log lines dropped by the worker")
        assert fake.messages()[1:] == [f"line {i}" for i in range(3, 8)]
        assert {(a, t) for a, t, _lines in fake.sent} == {("a-1", 7)}
        # After the outcome, the attempt's lines are discarded.
        calls = fake.calls
        log.info("too late")
        assert shipper.dropped == 4
    assert fake.calls == calls


async def test_buffered_bytes_are_bounded_too_counting_json_escapes() -> None:
    """Long lines fill memory before many lines do; and a line of control characters is
    six times longer on the wire, which is what counts."""
    fake = FakeLogs()
    async with shipping(fake, batch_bytes=1024, max_buffered_bytes=8192) as shipper:
        log = ctx_log(shipper)
        for _ in range(3):
            log.info("\x01" * 1000)  # about 6 KB each once escaped
        assert shipper.dropped == 2  # only the newest fits in 8 KB
        fake.up = True
        reported = asyncio.Event()
        shipper.then("a-1", reported.set)
        await within(reported.wait())
        assert fake.messages()[0].startswith("2 log lines dropped by the worker")
        assert fake.messages()[1:] == ["\x01" * 1000]


async def test_a_refused_attempt_drops_its_lines_and_reports_at_once() -> None:
    fake = FakeLogs()
    fake.up = fake.refuse = True
    async with shipping(fake, hold_max=600) as shipper:
        log = ctx_log(shipper)
        log.warning("one")
        log.warning("two")
        reported = asyncio.Event()
        shipper.then("a-1", reported.set)
        await within(reported.wait())  # not after hold_max: the 409 settles it
        assert fake.calls == 1 and shipper.dropped == 2
        log.error("three")
        assert shipper.dropped == 3
    assert fake.calls == 1


async def test_an_outcome_waits_for_its_lines_no_longer_than_hold_max() -> None:
    fake = FakeLogs()  # down for good
    async with shipping(fake, hold_max=0.2) as shipper:
        ctx_log(shipper).info("never sent")
        reported = asyncio.Event()
        shipper.then("a-1", reported.set)
        assert not reported.is_set()
        await within(reported.wait())
        assert shipper.dropped == 1 and fake.sent == []


async def test_levels_and_what_needs_no_wait() -> None:
    fake = FakeLogs()
    fake.up = True
    async with shipping(fake, level=logging.WARNING) as shipper:
        quiet = ctx_log(shipper, "a-quiet")
        quiet.info("below the level")
        done: list[str] = []
        shipper.then("a-quiet", lambda: done.append("quiet"))
        assert done == ["quiet"]  # nothing waiting: reported at once
        shipper.then("never-seen", lambda: done.append("unknown"))
        assert done == ["quiet", "unknown"]

        loud = ctx_log(shipper, "a-loud")
        loud.warning("kept %s", {"k": 1})
        loud.log(35, "a custom level")
        reported = asyncio.Event()
        shipper.then("a-loud", reported.set)
        await within(reported.wait())
    assert fake.messages() == ["kept {'k': 1}", "a custom level"]
    assert [line["level"] for _a, _t, lines in fake.sent for line in lines] == ["WARNING"] * 2

    off = LogShipper(cast(WorkerProtocol, fake), LogShipConfig(level=None))
    assert type(ctx_log(off)) is RunLogAdapter


async def test_close_sends_what_is_left_and_reports_every_outcome() -> None:
    fake = FakeLogs()
    fake.up = True
    shipper = LogShipper(cast(WorkerProtocol, fake), LogShipConfig(flush_interval=60))
    shipper.start()
    ctx_log(shipper, "a-1").info("last words")
    done: list[str] = []
    shipper.then("a-1", lambda: done.append("a-1"))
    await within(shipper.close())
    assert done == ["a-1"] and fake.messages() == ["last words"]


@pytest.mark.parametrize(
    "config",
    [{"flush_interval": 0}, {"batch_lines": 0}, {"batch_lines": 1001}, {"concurrency": 0}],
)
def test_bad_shipping_settings_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LogShipConfig(**config)


# -- the command line -------------------------------------------------------------------

ADMIN_KEY = "logs-cli-admin-key"
_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z  #1  INFO     ")


@dataclass
class Server:
    url: str
    operator_key: str
    worker_key: str
    runner: CliRunner = field(default_factory=CliRunner)

    @property
    def environ(self) -> dict[str, str]:
        return {"CRONWHEEL_URL": self.url, "CRONWHEEL_API_KEY": self.operator_key}

    def cli(self, *args: str, **env: str) -> Any:
        return self.runner.invoke(
            cli_app, list(args), env={**self.environ, "COLUMNS": "200", **env}
        )


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[Server]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with (
        BackgroundRuntime(Runtime(settings)) as running,
        Client(running.url, api_key=ADMIN_KEY) as admin,
    ):
        tenant = admin.tenants.create(f"cli-logs-{uuid.uuid4().hex[:6]}")
        worker = admin.tenants.create_key(tenant["id"], role="worker")
        yield Server(running.url, tenant["api_key"], worker["api_key"])


async def _dispatched(server: Server, task: str) -> str:
    """A job due now; its run id once the server's scheduler has dispatched it."""
    async with AsyncClient(server.url, api_key=server.operator_key) as client:
        job = await client.jobs.create(
            name=f"j-{uuid.uuid4().hex[:6]}", task=task, schedule={"asap": True}
        )
        run_id = str(job["first_run_id"])

        async def dispatched() -> bool:
            return (await client.runs.get(run_id))["state"] == "DISPATCHED"

        await wait_until_async(dispatched, 20, not_yet=())
    return run_id


async def test_cli_prints_a_runs_lines(server: Server) -> None:
    run_id = await _dispatched(server, "hello")
    worker = Worker(server.url, api_key=server.worker_key, lease_wait=1.0)

    @worker.task("hello")
    async def hello(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.log.info("hello from the handler")
        ctx.log.info("[bold]not markup[/bold]")

    await within(worker.run_async(drain=True))

    result = server.cli("runs", "logs", run_id)
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    assert len(printed) == 2 and all(_TIME.match(line) for line in printed), printed
    assert printed[0].endswith("hello from the handler")
    assert printed[1].endswith("[bold]not markup[/bold]")

    as_json = server.cli("runs", "logs", run_id, "--json")
    assert as_json.exit_code == 0, as_json.output
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["attempt"], r["level"], r["message"]) for r in rows] == [
        (1, "INFO", "hello from the handler"),
        (1, "INFO", "[bold]not markup[/bold]"),
    ]

    followed = server.cli("runs", "logs", run_id, "--follow")  # already over: returns
    assert followed.exit_code == 0 and followed.stdout == result.stdout

    none = server.cli("runs", "logs", run_id, "--attempt", "2")
    assert none.exit_code == 0 and none.stdout == "" and "no log lines" in none.stderr


def test_cli_errors_are_messages_and_non_zero_exits(server: Server) -> None:
    unknown = server.cli("runs", "logs", str(uuid.uuid4()))
    assert unknown.exit_code == 1 and "not_found" in unknown.stderr and unknown.stdout == ""
    bad = server.cli("runs", "logs", str(uuid.uuid4()), "--attempt", "0")
    assert bad.exit_code == 2
    no_key = server.cli("runs", "logs", str(uuid.uuid4()), CRONWHEEL_API_KEY="")
    assert no_key.exit_code == 2 and "no API key" in no_key.stderr
    worker_key = server.cli("runs", "logs", str(uuid.uuid4()), CRONWHEEL_API_KEY=server.worker_key)
    assert worker_key.exit_code == 1 and "forbidden" in worker_key.stderr
    down = server.cli("runs", "logs", str(uuid.uuid4()), CRONWHEEL_URL="http://127.0.0.1:9")
    assert down.exit_code == 1 and "is the server running" in down.stderr


async def test_cli_follows_a_live_run_until_it_is_over(server: Server) -> None:
    run_id = await _dispatched(server, "slow")
    worker = Worker(server.url, api_key=server.worker_key, lease_wait=1.0, log_shipping=QUICK)
    gate = threading.Event()

    @worker.task("slow")
    def slow(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.log.info("before")
        gate.wait(30)
        ctx.log.warning("after")

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    follower = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cronwheel",
        "runs",
        "logs",
        run_id,
        "--follow",
        "--interval",
        "0.1",
        env={**os.environ, **server.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert follower.stdout is not None
        first = await within(follower.stdout.readline())
        assert first.decode().rstrip().endswith("INFO     before")
        assert follower.returncode is None  # still following: the run is not over
        gate.set()
        out, err = await within(follower.communicate())
        assert follower.returncode == 0, err.decode()
        assert out.decode().rstrip().endswith("#1  WARNING  after")
    finally:
        gate.set()
        if follower.returncode is None:
            follower.kill()
            await follower.wait()
        stop.set()
        await within(running)
