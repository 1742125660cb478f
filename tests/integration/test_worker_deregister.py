"""A worker that stops while a long-poll is in flight: the server must not hand it a
run it will never receive, and what it was handed anyway goes back when the worker
deregisters at the end of its shutdown. Real uvicorn, real store, both backends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI
from test_worker_sdk import Env, within

from cronwheel import AsyncClient
from cronwheel.api import create_app
from cronwheel.client import Call
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext
from cronwheel.worker import session as session_module

# Far beyond any wait below: a run that comes back does so because it was released,
# never because its lease expired.
LONG_HEARTBEAT = 300


class LeaseTracker:
    """Wraps the real app to count lease requests the server is still handling, and
    can hold ``DELETE /v1/workers/…`` requests until told to go on."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.in_flight = 0
        self.hold_deletes = False
        self.deletes_go = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] == "http" and scope["method"] == "DELETE" and self.hold_deletes:
            await self.deletes_go.wait()
        if not path.endswith("/lease"):
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


@contextlib.asynccontextmanager
async def open_tracked(settings: Settings, store: Store) -> AsyncIterator[tuple[Env, LeaseTracker]]:
    app = create_app(settings, store)
    tracker = LeaseTracker(app)
    assert settings.admin_key is not None
    async with (
        serving(tracker) as url,
        AsyncClient(url, api_key=settings.admin_key) as admin,
    ):
        tenant = await admin.tenants.create(f"dereg-{uuid.uuid4().hex[:6]}")
        key = await admin.tenants.create_key(tenant["id"], role="worker")
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            try:
                yield Env(url, store, settings, operator, key["api_key"]), tracker
            finally:
                tracker.deletes_go.set()  # never leave the server waiting on a held request


def events_of(
    caplog: pytest.LogCaptureFixture, event: str, worker_id: str | None
) -> list[logging.LogRecord]:
    """The worker log lines of ``event`` from the worker ``worker_id``."""
    return [
        r
        for r in caplog.records
        if getattr(r, "event", None) == event and getattr(r, "worker_id", None) == worker_id
    ]


async def test_a_worker_stopped_mid_long_poll_leaves_no_run_running(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronwheel.worker")
    async with open_tracked(settings, store) as (env, tracker):
        api = tracker.app.state.api
        api.lease_poll_interval = 60.0  # only the dispatch notification wakes the poll
        first = env.worker(lease_wait=10)
        first.task("work")(_never_called)
        stop = asyncio.Event()
        running = asyncio.create_task(first.run_async(stop))
        await wait_until_async(lambda: api.notifier.waiting == 1)

        stop.set()
        await within(running, 5)  # no waiting out the long-poll
        # The worker deregistered as it stopped: the server side of its cut-off poll,
        # waiting until then, ends with that (not at a dispatch, nor at its timer a
        # minute away), so a run dispatched now cannot be leased to a client gone.
        await wait_until_async(lambda: tracker.in_flight == 0, 5)
        job = await env.job("work", heartbeat_timeout=LONG_HEARTBEAT)
        assert await env.fire() == 1
        await wait_until_async(lambda: tracker.in_flight == 0)

        second = env.worker()

        @second.task("work")
        async def work(ctx: TaskContext, payload: dict[str, Any]) -> str:
            return f"done on attempt {ctx.attempt}"

        await within(second.run_async(drain=True), 10)
        run = await env.run(job["first_run_id"])
        assert run["state"] == "SUCCESS", run
        assert run["result"] == "done on attempt 1"
        assert [a["state"] for a in run["attempts"]] == ["SUCCEEDED"]  # never leased to first
        [gone] = events_of(caplog, "worker.deregistered", first.worker_id)
        assert gone.released == 0


async def test_runs_leased_but_never_received_are_released_on_shutdown(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronwheel.worker")
    async with open_tracked(settings, store) as (env, _tracker):
        busy = await env.job("busy")
        await env.fire()
        started, go = asyncio.Event(), asyncio.Event()
        # One slot, taken: no lease request of its own is in flight afterwards.
        first = env.worker(concurrency=1, grace_period=30)

        @first.task("busy")
        async def hold(ctx: TaskContext, payload: dict[str, Any]) -> str:
            started.set()
            await go.wait()
            return "finished"

        first.task("lost")(_never_called)
        stop = asyncio.Event()
        running = asyncio.create_task(first.run_async(stop))
        await within(started.wait())
        # The server leases a run to this worker whose answer never reaches it (as
        # when a long-poll is cut off by the stop just after the lease committed).
        lost = await env.job("lost", heartbeat_timeout=LONG_HEARTBEAT)
        await env.fire()
        [worker_id] = {p.split("/")[3] for p, _ in env.transports[0].requests if "/lease" in p}
        record = await env.store.workers_get(uuid.UUID(worker_id))
        [leased] = await env.store.attempts_lease(worker=record, max=1)
        assert str(leased.run_id) == lost["first_run_id"]

        stop.set()
        go.set()
        await within(running, 10)
        assert first.stats.succeeded == 1 and first.stats.released == 0
        assert (await env.run(busy["first_run_id"]))["state"] == "SUCCESS"
        run = await env.run(lost["first_run_id"])
        assert run["state"] == "DISPATCHED" and run["attempt"] == 0, run
        assert [a["state"] for a in run["attempts"]] == ["RELEASED"]
        [gone] = events_of(caplog, "worker.deregistered", worker_id)
        assert gone.released == 1
        paths = [p for p, _ in env.transports[0].requests]
        assert paths[-1] == f"/v1/workers/{worker_id}"  # the very last call

        second = env.worker()

        @second.task("lost")
        async def found(ctx: TaskContext, payload: dict[str, Any]) -> str:
            return f"done on attempt {ctx.attempt}"

        await within(second.run_async(drain=True), 10)
        run = await env.run(lost["first_run_id"])
        assert run["state"] == "SUCCESS" and run["result"] == "done on attempt 1", run


async def test_a_hanging_deregister_does_not_hold_up_shutdown(
    settings: Settings,
    store: Store,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_module, "_DEREGISTER_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="cronwheel.worker")
    async with open_tracked(settings, store) as (env, tracker):
        tracker.hold_deletes = True
        worker = env.worker(lease_wait=0.1)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run_async(stop))
        await wait_until_async(lambda: any("/lease" in p for p, _ in env.transports[0].requests))
        stop.set()
        await within(running, 5)
        assert len(events_of(caplog, "worker.deregister_failed", worker.worker_id)) == 1
        assert not events_of(caplog, "worker.deregistered", worker.worker_id)
        assert events_of(caplog, "worker.stopped", worker.worker_id)


async def _never_called(ctx: TaskContext, payload: dict[str, Any]) -> None:
    raise AssertionError(f"run {ctx.run_id} reached a worker that had stopped")


async def test_a_worker_deregistered_by_someone_else_registers_again(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Its old id answers 410 from then on; the SDK takes a new one, as after a 404."""
    caplog.set_level(logging.INFO, logger="cronwheel.worker")
    async with open_tracked(settings, store) as (env, _tracker):
        worker = env.worker(lease_wait=0.2)

        @worker.task("work")
        async def work(ctx: TaskContext, payload: dict[str, Any]) -> str:
            return "done"

        stop = asyncio.Event()
        running = asyncio.create_task(worker.run_async(stop))
        transport = env.transports[0]

        def leasing_ids() -> list[str]:
            return list(
                dict.fromkeys(p.split("/")[3] for p, _ in transport.requests if "/lease" in p)
            )

        await transport.until(lambda: len(leasing_ids()) == 1)
        [first_id] = leasing_ids()
        async with AsyncClient(env.url, api_key=env.worker_key) as client:
            await client.send(Call("DELETE", f"/v1/workers/{first_id}"))

        await transport.until(lambda: len(leasing_ids()) == 2)
        job = await env.job("work")
        await env.fire()
        await wait_until_async(lambda: worker.stats.succeeded == 1)
        stop.set()
        await within(running, 10)
        second_id = leasing_ids()[1]
        assert worker.worker_id == second_id
        run = await env.run(job["first_run_id"])
        assert run["state"] == "SUCCESS"
        assert [a["worker_id"] for a in run["attempts"]] == [second_id]
        assert [p for p, _ in transport.requests].count("/v1/workers") == 2
