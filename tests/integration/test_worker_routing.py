"""Routing with the real SDK: each worker declares its handlers' tasks when it
registers, so a pool of workers with different task sets runs every run on a worker
that has its handler and fails none for want of one; a run whose task no worker runs
waits with a reason and an alert; route tags send a run only to workers carrying them.
The real API on a free port over the real store (both backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_worker_sdk import Env, open_env, within

from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext, Worker

ALL_SHARDS = list(range(256))


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


def _handles(worker: Worker, task: str, answer: str) -> None:
    @worker.task(task)
    async def handler(ctx: TaskContext, payload: dict[str, Any]) -> str:
        return answer


async def test_a_mixed_pool_runs_each_task_on_a_worker_that_has_it(env: Env) -> None:
    jobs = {
        task: [await env.job(task, retry={"max_attempts": 1}) for _ in range(3)]
        for task in ("reports.build", "ops.ping")
    }
    orphan = await env.job("billing.charge", retry={"max_attempts": 1})
    assert await env.fire() == 7
    reports, ops = env.worker(concurrency=4), env.worker(concurrency=4)
    _handles(reports, "reports.build", "reports")
    _handles(ops, "ops.ping", "ops")
    stop = asyncio.Event()
    running = [asyncio.create_task(w.run_async(stop)) for w in (reports, ops)]
    try:

        async def all_done() -> bool:
            page = await env.operator.runs.list(state="SUCCESS", limit=100)
            return len(page.items) == 6

        await wait_until_async(all_done, 30, what="the six runs to succeed")
        ran_on: dict[str, set[str]] = {}
        for task, answer in (("reports.build", "reports"), ("ops.ping", "ops")):
            for job in jobs[task]:
                run = await env.run(job["first_run_id"])
                [attempt] = run["attempts"]
                assert (run["state"], run["result"]) == ("SUCCESS", answer)
                ran_on.setdefault(task, set()).add(attempt["worker_id"])
        assert reports.stats.failed == ops.stats.failed == 0
        failed = await env.operator.runs.list(state=["FAILED", "DEAD_LETTER"])
        assert failed.items == []

        # Nobody runs billing.charge: it waits, and says why, while both workers live.
        run = await env.run(orphan["first_run_id"])
        assert (run["state"], run["attempts"]) == ("DISPATCHED", [])
        await env.store.runs_route_check(shards=ALL_SHARDS, min_wait=0.0, worker_ttl=30.0)
        reason = "no live worker in pool 'default' handles task 'billing.charge'"
        assert (await env.run(orphan["first_run_id"]))["wait_reason"] == reason
        [alert] = await env.operator.alerts.list()
        assert (alert["kind"], alert["runs"], alert["message"]) == (
            "unroutable_runs",
            1,
            f"1 run waiting: {reason}",
        )
    finally:
        stop.set()
        await within(asyncio.gather(*running))
    assert ran_on == {"reports.build": {reports.worker_id}, "ops.ping": {ops.worker_id}}
    assert (await env.run(orphan["first_run_id"]))["state"] == "DISPATCHED"


async def test_route_tags_pick_the_worker(env: Env) -> None:
    job = await env.job("train", route_tags=["red"])
    assert job["route_tags"] == ["red"]
    assert await env.fire() == 1
    blue = env.worker(tags=["blue"])
    _handles(blue, "train", "blue")
    await within(blue.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert (run["state"], run["route_tags"], blue.stats.leased) == ("DISPATCHED", ["red"], 0)

    both = env.worker(tags=["red", "blue"])
    _handles(both, "train", "red")
    await within(both.run_async(drain=True))
    run = await env.run(job["first_run_id"])
    assert (run["state"], run["result"]) == ("SUCCESS", "red")
