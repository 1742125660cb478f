"""Hung handlers under a progress timeout: the worker SDK against the real API on a free
port over the real store (both backends), with a real scheduler node beside it that
fires the runs, sweeps expired attempts and fires the retries.

A handler that hangs without reporting progress — async or sync — has its attempt
ended TIMED_OUT by the server once its progress deadline passes, learns it on the
worker's next heartbeat (the async one is cancelled, the sync one is asked to stop),
and the run is retried; the retry reports progress and succeeds."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_worker_sdk import Env, RecordingTransport, open_env, within

from cronwheel.scheduler import SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext

PROGRESS_TIMEOUT = 1.0
NO_PROGRESS = "no progress reported for 1 s (progress_timeout)"
RETRY = {"max_attempts": 2, "initial_delay": 0, "jitter": "none"}
LAST_STEP = 49


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        admin_key="test-admin-key-0123456789",
        lease_wait_max=10.0,
        heartbeat_interval=5.0,  # a progress timeout of 1 s must make the worker beat faster
        expire_interval=0.2,
    )


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    node = SchedulerNode(store, settings, node_id=f"node-{uuid.uuid4().hex[:6]}")
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        async with open_env(settings, store) as opened:
            yield opened
    finally:
        stop.set()
        await within(task)


def _reports(transport: RecordingTransport, attempt_id: str) -> list[Any]:
    """The details of every progress report the worker sent for ``attempt_id``."""
    return [
        beat.get("details")
        for body in transport.bodies("/v1/attempts/batch")
        for beat in body["heartbeats"]
        if beat["attempt_id"] == attempt_id and beat.get("progress")
    ]


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_handler_hanging_without_progress_is_timed_out_and_retried(
    env: Env, kind: str
) -> None:
    worker = env.worker(concurrency=2)
    transport = env.transports[-1]
    first_stopped = threading.Event()  # set by the hung attempt once it was stopped
    second_id: list[str] = []
    proceed = asyncio.Event()  # the retry may finish: its last report reached the server
    loop = asyncio.get_running_loop()

    if kind == "async":

        @worker.task("stuck")
        async def stuck(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            assert ctx.progress_timeout == PROGRESS_TIMEOUT
            if ctx.attempt == 1:
                try:
                    await asyncio.Event().wait()  # hangs, reporting nothing
                finally:
                    first_stopped.set()  # cancelled by the worker
            second_id.append(ctx.attempt_id)
            for step in range(LAST_STEP + 1):  # many reports: only the last one travels
                ctx.heartbeat({"step": step})
            await proceed.wait()
            return {"attempt": ctx.attempt}

    else:

        @worker.task("stuck")
        def stuck_sync(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            assert ctx.progress_timeout == PROGRESS_TIMEOUT
            if ctx.attempt == 1:
                # Hangs, reporting nothing, until asked to stop (a thread cannot be
                # cancelled); the bound only keeps a broken worker from hanging pytest.
                if ctx.wait_cancelled(60):
                    first_stopped.set()
                return {"attempt": 1}  # too late: the worker drops it
            loop.call_soon_threadsafe(second_id.append, ctx.attempt_id)
            for step in range(LAST_STEP + 1):
                ctx.heartbeat({"step": step})
            asyncio.run_coroutine_threadsafe(proceed.wait(), loop).result(timeout=60)
            return {"attempt": ctx.attempt}

    job = await env.job(
        "stuck", progress_timeout=PROGRESS_TIMEOUT, heartbeat_timeout=30, retry=RETRY
    )
    run_id = job["first_run_id"]
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    try:
        await transport.until(lambda: bool(second_id))
        await transport.until(lambda: {"step": LAST_STEP} in _reports(transport, second_id[0]))
        proceed.set()

        async def succeeded() -> bool:
            return (await env.run(run_id))["state"] == "SUCCESS"

        await wait_until_async(succeeded, 20, not_yet=())
    finally:
        stop.set()
        await within(running)

    assert first_stopped.is_set()  # the worker stopped waiting on the hung handler
    assert worker.stats.lost == 1 and worker.stats.succeeded == 1
    run = await env.run(run_id)
    assert run["progress_timeout"] == PROGRESS_TIMEOUT
    first, second = run["attempts"]
    assert (first["state"], first["error"]) == ("TIMED_OUT", NO_PROGRESS)
    assert first["progress_at"] is None and first["progress_details"] is None
    # Never before its progress deadline; and (the sweep runs every 0.2 s) not much later.
    ran = _seconds(first["started_at"], first["finished_at"])
    assert PROGRESS_TIMEOUT - 0.01 <= ran < PROGRESS_TIMEOUT + 5, ran
    retried = [e["reason"] or "" for e in run["events"] if e["to_state"] == "SCHEDULED"]
    assert f"retry 2 of 2 in 0.00 s: {NO_PROGRESS}" in retried, retried

    assert (second["state"], second["progress_details"]) == ("SUCCEEDED", {"step": LAST_STEP})
    assert run["result"] == {"attempt": 2}
    # Reports rode on the batched heartbeats, the last one winning; none had a request
    # of its own.
    reports = _reports(transport, second["id"])
    assert reports[-1] == {"step": LAST_STEP}
    assert len(reports) < LAST_STEP + 1
    assert not [p for p, _ in transport.requests if p.endswith("/heartbeat")]
