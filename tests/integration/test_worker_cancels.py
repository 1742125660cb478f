"""A cancel reaches a running handler through the worker's cancels long-poll, without
waiting for a heartbeat — also when every slot is busy (no lease long-poll open) — and
by the heartbeat still when the long-poll hears nothing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_worker_sdk import Env, within

from cronwheel import AsyncClient
from cronwheel.api import create_app
from cronwheel.api.notifier import CancelNotifier
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext

# The job's heartbeat timeout, an hour: the worker beats every third of it, so no
# heartbeat comes while a test runs — only the long-poll can bring a cancel.
NO_BEAT = {"heartbeat_timeout": 3600}


class DeafCancels(CancelNotifier):
    """Hears no notice, and holds every cancels long-poll until its worker deregisters
    or the app stops: as if every notice were lost, so only a heartbeat can bring a
    cancel."""

    async def _on_notices(self, payloads: list[str]) -> None:
        return None

    async def wait(self, ticket: asyncio.Event, timeout: float) -> None:
        await super().wait(ticket, 3600)


@contextlib.asynccontextmanager
async def open_env(
    settings: Settings, store: Store, *, deaf: bool = False
) -> AsyncIterator[tuple[Env, Any]]:
    """The API on a free port (with ``deaf``, its cancels notifier hears nothing), a
    tenant with an operator client and a worker key; and the app."""
    assert settings.admin_key is not None
    app = create_app(settings, store)
    if deaf:
        app.state.api.cancels = DeafCancels(store)
    async with (
        serving(app) as url,
        AsyncClient(url, api_key=settings.admin_key) as admin,
    ):
        tenant = await admin.tenants.create(f"cancels-{uuid.uuid4().hex[:6]}")
        key = await admin.tenants.create_key(tenant["id"], role="worker")
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            yield Env(url, store, settings, operator, key["api_key"]), app


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[tuple[Env, Any]]:
    async with open_env(settings, store) as opened:
        yield opened


@pytest.fixture
async def deaf_env(settings: Settings, store: Store) -> AsyncIterator[tuple[Env, Any]]:
    async with open_env(settings, store, deaf=True) as opened:
        yield opened


def heartbeats_sent(env: Env) -> int:
    return sum(
        len(body.get("heartbeats") or [])
        for body in env.transports[-1].bodies("/v1/attempts/batch")
    )


async def test_a_cancel_reaches_a_busy_worker_without_a_heartbeat(
    env: tuple[Env, Any],
) -> None:
    env_, app = env
    jobs = [await env_.job("long", **NO_BEAT) for _ in range(2)]
    await env_.fire()
    started: list[str] = []
    both = asyncio.Event()
    told: dict[str, bool] = {}
    cancelled = asyncio.Event()
    # Every slot busy: the lease loop waits for a slot, with no long-poll open.
    worker = env_.worker(concurrency=2, heartbeat_interval=3600, lease_wait=10, grace_period=0.2)

    @worker.task("long")
    async def long(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.append(ctx.run_id)
        if len(started) == 2:
            both.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            told[ctx.run_id] = ctx.cancel_requested
            cancelled.set()
            raise

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(both.wait())
    await within(wait_until_async(lambda: app.state.api.cancels.waiting == 1))
    target = jobs[0]["first_run_id"]
    run = await env_.operator.runs.cancel(target, reason="changed my mind")
    assert run["state"] == "RUNNING"  # cooperative: the worker has to hear of it
    await within(cancelled.wait())
    assert told == {target: True}  # the other handler runs on
    assert heartbeats_sent(env_) == 0  # no heartbeat brought it
    stop.set()
    await within(running)
    run = await env_.run(target)
    assert run["state"] == "CANCELLED"
    assert "cancelled on request" in run["attempts"][0]["error"]
    assert (await env_.run(jobs[1]["first_run_id"]))["state"] == "DISPATCHED"  # handed back


async def test_a_job_cancel_reaches_a_sync_handler_without_a_heartbeat(
    env: tuple[Env, Any],
) -> None:
    env_, _ = env
    job = await env_.job("blocking", **NO_BEAT)
    await env_.fire()
    started = threading.Event()
    told: list[bool] = []
    worker = env_.worker(concurrency=1, heartbeat_interval=3600, lease_wait=10)

    @worker.task("blocking")
    def blocking(ctx: TaskContext, payload: dict[str, Any]) -> str:
        started.set()
        told.append(ctx.wait_cancelled(60))
        return "stopped"

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(asyncio.to_thread(started.wait, 20))
    await env_.operator.jobs.cancel(job["id"])
    await within(wait_until_async(lambda: bool(told)))
    assert told == [True] and heartbeats_sent(env_) == 0
    stop.set()
    await within(running)
    run = await env_.run(job["first_run_id"])
    assert run["state"] == "CANCELLED"


async def test_a_lost_notice_still_reaches_the_handler_by_heartbeat(
    deaf_env: tuple[Env, Any],
) -> None:
    env_, app = deaf_env
    job = await env_.job("long")
    await env_.fire()
    started = asyncio.Event()
    cancelled = asyncio.Event()
    told: list[bool] = []
    worker = env_.worker(concurrency=1, heartbeat_interval=0.05, lease_wait=10)

    @worker.task("long")
    async def long(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            told.append(ctx.cancel_requested)
            cancelled.set()
            raise

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await within(started.wait())
    # The long-poll is open, and will never answer: the heartbeat is the only way.
    await within(wait_until_async(lambda: app.state.api.cancels.waiting == 1))
    await env_.operator.runs.cancel(job["first_run_id"])
    await within(cancelled.wait())
    assert told == [True] and heartbeats_sent(env_) > 0
    stop.set()
    await within(running)
    assert (await env_.run(job["first_run_id"]))["state"] == "CANCELLED"
