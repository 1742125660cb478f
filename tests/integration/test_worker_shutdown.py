"""Stopping a worker: the grace period, releasing what is still running, cooperative
cancellation, lost leases, and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_worker_sdk import Env, LogEvents, open_env, within

from cronwheel import Client
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.worker import TaskContext, Worker


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


async def test_shutdown_releases_what_is_still_running(env: Env) -> None:
    job = await env.job("stuck")
    await env.fire()
    started = asyncio.Event()
    cancelled = asyncio.Event()
    # One slot: once it is taken no lease request is in flight, so the released run
    # cannot be leased again by the server side of an abandoned long-poll.
    worker = env.worker(grace_period=0.2, concurrency=1)

    @worker.task("stuck")
    async def stuck(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(started.wait())
    stop.set()
    await within(running)

    assert cancelled.is_set() and worker.stats.released == 1 and worker.stats.succeeded == 0
    run = await env.run(job["first_run_id"])
    assert run["state"] == "DISPATCHED"  # ready again at once, the try not counted
    assert [a["state"] for a in run["attempts"]] == ["RELEASED"]

    second = env.worker()

    @second.task("stuck")
    async def unstuck(ctx: TaskContext, payload: dict[str, Any]) -> str:
        return f"done on attempt {ctx.attempt}"

    await within(second.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert run["state"] == "SUCCESS" and run["result"] == "done on attempt 1"


async def test_a_sync_handler_past_the_grace_period_is_told_to_stop(env: Env) -> None:
    job = await env.job("blocking")
    await env.fire()
    started = threading.Event()
    told: list[bool] = []
    worker = env.worker(grace_period=0.1, concurrency=1)  # one slot: see above

    @worker.task("blocking")
    def blocking(ctx: TaskContext, payload: dict[str, Any]) -> str:
        started.set()
        told.append(ctx.wait_cancelled(30))
        return "too late"

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(asyncio.to_thread(started.wait, 20))
    stop.set()
    await within(running)
    run = await env.run(job["first_run_id"])
    assert worker.stats.released == 1 and worker.stats.succeeded == 0, worker.stats
    assert run["state"] == "DISPATCHED" and [a["state"] for a in run["attempts"]] == ["RELEASED"]


async def test_handlers_finishing_within_the_grace_period_complete(env: Env) -> None:
    jobs = [await env.job("finishing") for _ in range(3)]
    await env.fire()
    started: list[str] = []
    all_started = asyncio.Event()
    go = asyncio.Event()
    worker = env.worker(concurrency=3, grace_period=30)

    @worker.task("finishing")
    async def finishing(ctx: TaskContext, payload: dict[str, Any]) -> str:
        started.append(ctx.run_id)
        if len(started) == 3:
            all_started.set()
        await go.wait()
        return "finished"

    stop = asyncio.Event()
    with LogEvents("cronwheel.worker") as events:
        running = asyncio.create_task(worker.run_async(stop))
        await within(all_started.wait())
        stop.set()
        await events.until("worker.draining")
    assert not running.done() and worker.running == 3
    go.set()
    await within(running)
    assert worker.stats.succeeded == 3 and worker.stats.released == 0
    for job in jobs:
        assert (await env.run(job["first_run_id"]))["state"] == "SUCCESS"


async def test_cancel_request_reaches_the_handler_through_the_heartbeat(env: Env) -> None:
    job = await env.job("long")
    await env.fire()
    started = asyncio.Event()
    cancelled = asyncio.Event()
    flags: list[bool] = []
    worker = env.worker(heartbeat_interval=0.05)

    @worker.task("long")
    async def long(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            flags.append(ctx.cancel_requested)
            cancelled.set()
            raise

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(started.wait())
    run = await env.operator.runs.cancel(job["first_run_id"], reason="changed my mind")
    assert run["state"] == "RUNNING"  # cooperative: the worker has to hear of it
    await within(cancelled.wait())
    stop.set()
    await within(running)
    assert flags == [True]
    run = await env.run(job["first_run_id"])
    assert run["state"] == "CANCELLED"
    [attempt] = run["attempts"]
    assert "cancelled on request" in attempt["error"]


async def test_a_lost_lease_stops_the_handler_and_reports_nothing(env: Env) -> None:
    job = await env.job("slow", retry={"max_attempts": 3, "initial_delay": 0})
    await env.fire()
    started = asyncio.Event()
    stopped = asyncio.Event()
    contexts: list[TaskContext] = []
    worker = env.worker(heartbeat_interval=0.05)

    @worker.task("slow")
    async def slow(ctx: TaskContext, payload: dict[str, Any]) -> None:
        contexts.append(ctx)
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(started.wait())
    # As if the worker had gone silent: the scheduler ends the attempt as LOST.
    later = await env.store.db_now() + timedelta(minutes=10)
    assert await env.store.attempts_expire(now=later) == 1
    await within(stopped.wait())
    stop.set()
    await within(running)
    assert contexts[0].lease_lost and worker.stats.lost == 1
    assert worker.stats.succeeded == worker.stats.failed == worker.stats.rejected == 0
    run = await env.run(job["first_run_id"])
    assert [a["state"] for a in run["attempts"]] == ["LOST"]


def test_sigterm_stops_leasing_and_lets_the_handler_finish(store_url: str, tmp_path: Path) -> None:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key="admin-k")
    with (
        BackgroundRuntime(Runtime(settings)) as server,
        Client(server.url, api_key="admin-k") as admin,
    ):
        tenant = admin.tenants.create(f"sig-{uuid.uuid4().hex[:6]}")
        worker_key = admin.tenants.create_key(tenant["id"], role="worker")["api_key"]
        operator = admin.with_tenant(tenant["id"])
        job = operator.jobs.create(name="sig", schedule={"asap": True}, task="sig")

        started, go = threading.Event(), threading.Event()
        worker = Worker(server.url, api_key=worker_key, lease_wait=1.0, grace_period=30)

        @worker.task("sig")
        async def sig(ctx: TaskContext, payload: dict[str, Any]) -> str:
            started.set()
            await asyncio.to_thread(go.wait, 30)
            return "finished after SIGTERM"

        def terminate() -> None:
            if started.wait(30):
                os.kill(os.getpid(), signal.SIGTERM)
                go.set()

        killer = threading.Thread(target=terminate)
        killer.start()
        worker.run()  # returns once the signal's graceful shutdown is over
        killer.join()

        assert started.is_set() and worker.stats.succeeded == 1
        run = operator.runs.get(job["first_run_id"])
        assert run["state"] == "SUCCESS" and run["result"] == "finished after SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.fixture(autouse=True)
def _no_leftover_signal_handlers() -> None:
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
