"""A worker running a run whose job is deleted (force): its next heartbeat is refused as
stale, so it abandons the attempt as a lost lease — no error, nothing brought back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_worker_sdk import Env, open_env, within

from cronwheel import ApiError
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.worker import TaskContext


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


async def test_the_worker_of_a_deleted_jobs_run_loses_its_lease(env: Env) -> None:
    job = await env.job("hold")
    assert await env.fire() == 1
    worker = env.worker(heartbeat_interval=0.05)
    started, ended = asyncio.Event(), asyncio.Event()

    @worker.task("hold")
    async def hold(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # until the worker stops it
        finally:
            ended.set()

    running = asyncio.create_task(worker.run_async(drain=True))
    await within(started.wait())
    with pytest.raises(ApiError) as refused:
        await env.operator.jobs.delete(job["id"])
    assert (refused.value.status, refused.value.code) == (409, "in_use")

    deleted = await env.operator.jobs.delete(job["id"], force=True, reason="gone")
    assert deleted["runs_stopped"] == [{"id": job["first_run_id"], "state": "RUNNING"}]
    await within(running)
    assert ended.is_set()
    stats = worker.stats
    assert (stats.lost, stats.succeeded, stats.failed, stats.released) == (1, 0, 0, 0)
    with pytest.raises(ApiError) as gone:
        await env.run(job["first_run_id"])
    assert gone.value.status == 404
    assert (await env.operator.runs.list(job_id=job["id"])).items == []
