"""The worker SDK against the real API served by uvicorn on a free port, over the real
store (both backends). Runs are fired as a scheduler owning every shard would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest

from cronwheel import ApiError, AsyncClient
from cronwheel.api import create_app
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.worker import NonRetryableError, TaskContext, Worker

ALL_SHARDS = range(256)
FAST_RETRY = {"max_attempts": 3, "initial_delay": 0, "jitter": "none"}


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The real transport, remembering each request's path and JSON body."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, Any]] = []
        self._sent = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        self._sent.set()
        return await super().handle_async_request(request)

    async def until(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        """Wait until ``predicate`` holds, checking it after each request."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._sent.clear()
                await self._sent.wait()

    def bodies(self, path: str) -> list[Any]:
        return [b for p, b in self.requests if p == path]


@dataclass
class Env:
    url: str
    store: Store
    settings: Settings
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

    def worker(self, **kwargs: Any) -> Worker:
        transport = RecordingTransport()
        self.transports.append(transport)
        kwargs.setdefault("lease_wait", 1.0)
        return Worker(self.url, api_key=self.worker_key, transport=transport, **kwargs)

    async def run(self, run_id: str) -> dict[str, Any]:
        return await self.operator.runs.get(run_id)


@contextlib.asynccontextmanager
async def open_env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    """The API on a free port, a tenant with an operator client and a worker key."""
    assert settings.admin_key is not None
    async with (
        serving(create_app(settings, store)) as url,
        AsyncClient(url, api_key=settings.admin_key) as admin,
    ):
        tenant = await admin.tenants.create(f"workers-{uuid.uuid4().hex[:6]}")
        key = await admin.tenants.create_key(tenant["id"], role="worker")
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            yield Env(url, store, settings, operator, key["api_key"])


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


async def within(aw: Awaitable[Any], seconds: float = 20.0) -> Any:
    """Await with a deadline, so a broken worker fails the test instead of hanging it."""
    async with asyncio.timeout(seconds):
        return await aw


async def test_handlers_succeed_with_their_context(env: Env) -> None:
    jobs = [await env.job("greet", payload={"who": f"w{i}"}) for i in range(3)]
    assert await env.fire() == 3
    seen: dict[str, TaskContext] = {}
    worker = env.worker(concurrency=5)

    @worker.task("greet")
    async def greet(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        seen[ctx.run_id] = ctx
        ctx.log.info("greeting %s", payload["who"])
        return {"hello": payload["who"]}

    await within(worker.run_async(drain=True))

    assert worker.stats.succeeded == 3 and worker.held == 0 and worker.running == 0
    for job in jobs:
        run = await env.run(job["first_run_id"])
        assert run["state"] == "SUCCESS"
        assert run["result"] == {"hello": job["payload"]["who"]}
        [attempt] = run["attempts"]
        ctx = seen[run["id"]]
        assert (ctx.attempt, ctx.job_id, ctx.task) == (1, job["id"], "greet")
        assert ctx.attempt_id == attempt["id"] and ctx.fencing_token == attempt["fencing_token"]
        assert ctx.idempotency_key == f"{run['id']}:1" and not ctx.cancel_requested


async def test_a_failure_is_retried_then_succeeds(env: Env) -> None:
    job = await env.job("flaky", retry=FAST_RETRY)
    await env.fire()
    worker = env.worker()

    @worker.task("flaky")
    async def flaky(ctx: TaskContext, payload: dict[str, Any]) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return "ok"

    await within(worker.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "SCHEDULED" and "RuntimeError: first try fails" in run["last_error"]

    assert await env.fire() == 1
    await within(worker.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "SUCCESS" and run["result"] == "ok" and run["attempt"] == 2
    assert [a["state"] for a in run["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert "Traceback" in run["attempts"][0]["error"]
    assert (worker.stats.failed, worker.stats.succeeded) == (1, 1)


async def test_retries_exhausted_is_a_dead_letter(env: Env) -> None:
    job = await env.job("broken", retry={**FAST_RETRY, "max_attempts": 2})
    worker = env.worker()

    @worker.task("broken")
    def broken(ctx: TaskContext, payload: dict[str, Any]) -> None:
        raise ValueError(f"attempt {ctx.attempt} broke")

    for _ in range(2):
        assert await env.fire() == 1
        await within(worker.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "DEAD_LETTER" and "attempt 2 broke" in run["last_error"]


async def test_non_retryable_error_fails_at_once(env: Env) -> None:
    job = await env.job("strict", retry=FAST_RETRY)
    await env.fire()
    worker = env.worker()

    @worker.task("strict")
    async def strict(ctx: TaskContext, payload: dict[str, Any]) -> None:
        raise NonRetryableError("bad input, retrying cannot help")

    await within(worker.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "FAILED" and run["attempt"] == 1
    assert "bad input" in run["last_error"]
    assert await env.fire() == 0


async def test_unknown_task_is_not_leased_and_unserialisable_result_fails(env: Env) -> None:
    unknown = await env.job("nobody.does.this", retry=FAST_RETRY)
    odd = await env.job("odd", retry=FAST_RETRY)
    await env.fire()
    worker = env.worker()

    @worker.task("odd")
    async def odd_result(ctx: TaskContext, payload: dict[str, Any]) -> object:
        return object()

    await within(worker.run_async(drain=True))
    # The worker declared its tasks when it registered: it is never handed another one.
    run = await env.run(unknown["first_run_id"])
    assert (run["state"], run["attempts"]) == ("DISPATCHED", [])
    register = env.transports[-1].bodies("/v1/workers")
    assert [body["tasks"] for body in register] == [["odd"]]
    run = await env.run(odd["first_run_id"])
    assert run["state"] == "FAILED" and "not JSON-serialisable" in run["last_error"]


async def test_a_handler_removed_after_registering_fails_its_run_without_retry(env: Env) -> None:
    first = await env.job("first", priority=0)
    second = await env.job("second", priority=3, retry=FAST_RETRY)
    await env.fire()
    worker = env.worker(concurrency=1)

    @worker.task("first")
    async def drop_second(ctx: TaskContext, payload: dict[str, Any]) -> None:
        worker.registry.remove("second")

    @worker.task("second")
    async def never(ctx: TaskContext, payload: dict[str, Any]) -> None:
        raise AssertionError("removed before its run came")

    await within(worker.run_async(drain=True))
    assert (await env.run(first["first_run_id"]))["state"] == "SUCCESS"
    run = await env.run(second["first_run_id"])
    assert run["state"] == "FAILED" and run["attempt"] == 1
    assert "no handler for task 'second' on this worker (it has: first)" in run["last_error"]


async def test_sync_handlers_run_in_a_thread_pool(env: Env) -> None:
    jobs = [await env.job("blocking", payload={"n": i}) for i in range(4)]
    await env.fire()
    threads: set[int] = set()
    worker = env.worker(concurrency=2)

    @worker.task("blocking")
    def blocking(ctx: TaskContext, payload: dict[str, Any]) -> int:
        threads.add(threading.get_ident())
        return int(payload["n"]) * 10

    await within(worker.run_async(drain=True))
    assert threading.get_ident() not in threads
    for job in jobs:
        run = await env.run(job["first_run_id"])
        assert run["state"] == "SUCCESS" and run["result"] == job["payload"]["n"] * 10


async def test_leases_and_outcomes_are_batched(env: Env) -> None:
    for i in range(30):
        await env.job("quick", payload={"i": i})
    assert await env.fire() == 30
    worker = env.worker(concurrency=10, prefetch=0)

    @worker.task("quick")
    async def quick(ctx: TaskContext, payload: dict[str, Any]) -> int:
        return int(payload["i"])

    await within(worker.run_async(drain=True))
    assert worker.stats.succeeded == 30
    transport = env.transports[-1]
    leases = transport.bodies(f"/v1/workers/{worker.worker_id}/lease")
    assert all(body["max"] <= 10 for body in leases)
    batches = transport.bodies("/v1/attempts/batch")
    assert sum(len(b["completions"]) for b in batches) == 30
    assert len(batches) <= 15, f"{len(batches)} batch requests for 30 completions"
    assert not [p for p, _ in transport.requests if p.endswith("/complete")]
    page = await env.operator.runs.list(state="SUCCESS", limit=100)
    assert len(page.items) == 30


async def test_short_handlers_keep_leased_runs_waiting_for_a_slot(env: Env) -> None:
    for i in range(80):
        await env.job("quick", payload={"i": i}, priority=i % 4)
    assert await env.fire() == 80
    worker = env.worker(concurrency=2, prefetch=3)
    running = most = 0

    @worker.task("quick")
    async def quick(ctx: TaskContext, payload: dict[str, Any]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.002)
        running -= 1

    await within(worker.run_async(drain=True))
    assert worker.stats.succeeded == 80 and most <= 2
    # Handlers this short finish more than 30 runs a second: runs were leased while
    # both slots were busy, never more than the slots and the prefetch together.
    assert worker.stats.waited > 0
    leases = env.transports[-1].bodies(f"/v1/workers/{worker.worker_id}/lease")
    assert all(body["max"] <= 2 + 3 for body in leases)


async def test_long_handlers_or_no_prefetch_lease_only_for_free_slots(env: Env) -> None:
    for i in range(4):
        await env.job("slow", payload={"i": i})
    for i in range(40):
        await env.job("quick", payload={"i": i})
    assert await env.fire() == 44
    slow = env.worker(concurrency=2)  # at most a few runs a second: nothing waits
    quick = env.worker(concurrency=2, prefetch=0)

    @slow.task("slow")
    async def sleep(ctx: TaskContext, payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.5)

    @quick.task("quick")
    async def noop(ctx: TaskContext, payload: dict[str, Any]) -> None:
        return None

    await within(asyncio.gather(slow.run_async(drain=True), quick.run_async(drain=True)))
    assert (slow.stats.succeeded, quick.stats.succeeded) == (4, 40)
    assert slow.stats.waited == quick.stats.waited == 0
    for worker, transport in zip((slow, quick), env.transports[-2:], strict=True):
        leases = transport.bodies(f"/v1/workers/{worker.worker_id}/lease")
        assert leases and all(body["max"] <= 2 for body in leases)


async def test_one_heartbeat_request_covers_every_held_attempt(env: Env) -> None:
    for _ in range(5):
        await env.job("hold")
    await env.fire()
    worker = env.worker(concurrency=5, heartbeat_interval=0.05)
    transport = env.transports[-1]
    go = asyncio.Event()

    @worker.task("hold")
    async def hold(ctx: TaskContext, payload: dict[str, Any]) -> None:
        await go.wait()

    def full_beats() -> int:
        return sum(1 for b in transport.bodies("/v1/attempts/batch") if len(b["heartbeats"]) == 5)

    running = asyncio.create_task(worker.run_async(drain=True))
    await transport.until(lambda: full_beats() >= 2)
    go.set()
    await within(running)
    assert worker.stats.succeeded == 5
    for body in transport.bodies("/v1/attempts/batch"):
        assert not body["heartbeats"] or not (body["completions"] or body["failures"])
    assert not [p for p, _ in transport.requests if p.endswith("/heartbeat")]


async def test_deadline_cancels_an_async_handler(env: Env) -> None:
    job = await env.job("slow", timeout=1, retry={"max_attempts": 1})
    await env.fire()
    worker = env.worker()

    @worker.task("slow")
    async def slow(ctx: TaskContext, payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    await within(worker.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "DEAD_LETTER" and "deadline exceeded" in run["last_error"]


async def test_worker_waits_out_an_unreachable_server(env: Env) -> None:
    job = await env.job("later")
    await env.fire()
    port = free_port()
    worker = Worker(f"http://127.0.0.1:{port}", api_key=env.worker_key, backoff_max=0.05)

    @worker.task("later")
    async def later(ctx: TaskContext, payload: dict[str, Any]) -> str:
        return "made it"

    with LogEvents("cronwheel.worker") as events:
        running = asyncio.create_task(worker.run_async(drain=True))
        await events.until("worker.register_failed")
    assert not running.done()
    async with serving(create_app(env.settings, env.store), port=port):
        await within(running)
    run = await env.run(job["first_run_id"])
    assert run["state"] == "SUCCESS" and run["result"] == "made it"


async def test_bad_worker_key_fails_fast(env: Env) -> None:
    worker = Worker(env.url, api_key="cw_not-a-key")
    with pytest.raises(ApiError) as info:
        await within(worker.run_async(drain=True))
    assert info.value.status == 401


def test_worker_refuses_bad_settings() -> None:
    for kwargs in (
        {"concurrency": 0},
        {"grace_period": -1},
        {"heartbeat_interval": 0},
        {"api_key": ""},
    ):
        with pytest.raises(ValueError):
            Worker("http://127.0.0.1:1", **{"api_key": "k", **kwargs})
    with pytest.raises(ValueError, match="URL"):
        Worker("127.0.0.1:8000", api_key="k")
    worker = Worker("http://127.0.0.1:1", api_key="k")
    worker.task("a")(lambda ctx, payload: None)
    with pytest.raises(ValueError, match="already has a handler"):
        worker.task("a")(lambda ctx, payload: None)


# -- helpers -------------------------------------------------------------------------


def free_port() -> int:
    """A port that was free a moment ago (nothing listens there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class LogEvents(logging.Handler):
    """The ``event`` of each log line of a logger, with a way to wait for one."""

    def __init__(self, logger: str) -> None:
        super().__init__(logging.DEBUG)
        self.logger = logging.getLogger(logger)
        self.seen: list[str] = []
        self._new = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(str(getattr(record, "event", "")))
        self._new.set()

    async def until(self, event: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while event not in self.seen:
                self._new.clear()
                await self._new.wait()

    def __enter__(self) -> LogEvents:
        self.logger.addHandler(self)
        self._level = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)
