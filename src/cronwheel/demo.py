"""``cronwheel demo``: a server with something to look at.

Inside the server's process, once it is ready:

- a ``demo`` tenant (made through the store if missing) with a fresh operator key and
  a fresh worker key;
- an SDK :class:`~cronwheel.worker.Worker` connected to the server over HTTP, with
  handlers that succeed, fail once then succeed, and run as sync code;
- the recurring :data:`DEMO_JOBS` (intervals of a few seconds and a cron expression),
  each created once through the API: idempotency keys make a restart on the same data
  directory find the jobs it made before instead of duplicating them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cronwheel.client import AsyncClient
from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import NotFoundError
from cronwheel.runtime import Runtime
from cronwheel.store import Store
from cronwheel.worker import NonRetryableError, TaskContext, Worker

__all__ = [
    "DEMO_JOBS",
    "DEMO_TENANT",
    "Announce",
    "Demo",
    "DemoJob",
    "DemoKeys",
    "create_demo_jobs",
    "demo_worker",
    "ensure_demo_tenant",
]

log = logging.getLogger("cronwheel.demo")

DEMO_TENANT = "demo"
# What the demo's own set-up records as its author.
_DEMO = Actor(name="demo", role="admin")


@dataclass(frozen=True, slots=True)
class DemoJob:
    name: str
    task: str
    schedule: dict[str, Any]  # a recurring schedule: {"interval": …} or {"cron": …}
    payload: dict[str, Any] = field(default_factory=dict)
    retry: dict[str, Any] | None = None

    @property
    def every(self) -> str:
        """The schedule in a few words."""
        if "interval" in self.schedule:
            return f"every {self.schedule['interval']:g} s"
        return f"cron {self.schedule['cron']} {self.schedule.get('timezone', 'UTC')}"


DEMO_JOBS: tuple[DemoJob, ...] = (
    DemoJob("demo-hello", "demo.hello", {"interval": 5}, payload={"greeting": "hello"}),
    DemoJob(
        "demo-flaky",
        "demo.flaky",
        {"interval": 10},
        retry={"max_attempts": 3, "initial_delay": 1.0, "jitter": "none"},
    ),
    DemoJob(
        "demo-report",
        "demo.report",
        {"cron": "*/1 * * * *", "timezone": "Europe/Paris"},
        payload={"rows": 1000},
    ),
)


# -- handlers ------------------------------------------------------------------------


def demo_worker(url: str, api_key: str, *, concurrency: int = 4) -> Worker:
    """A worker with the demo's handlers."""
    worker = Worker(
        url,
        api_key=api_key,
        pool="default",
        concurrency=concurrency,
        name="demo-worker",
        grace_period=5.0,
    )

    @worker.task("demo.hello")
    async def hello(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.1, 1.0))  # pretend to work
        ctx.log.info("%s from run %s", payload.get("greeting", "hi"), ctx.run_id)
        return {"greeting": payload.get("greeting", "hi"), "attempt": ctx.attempt}

    @worker.task("demo.flaky")
    async def flaky(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt always fails (this is the demo of retries)")
        return {"recovered_on_attempt": ctx.attempt}

    @worker.task("demo.report")
    def report(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        rows = payload.get("rows")
        if not isinstance(rows, int) or rows < 0:
            raise NonRetryableError("payload.rows must be a non-negative integer")
        started = time.perf_counter()
        total = sum(range(rows))  # blocking work: runs in the worker's thread pool
        return {"rows": rows, "total": total, "seconds": round(time.perf_counter() - started, 6)}

    return worker


# -- tenant and keys -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoKeys:
    tenant_id: str
    operator_key: str
    worker_key: str


async def ensure_demo_tenant(store: Store) -> DemoKeys:
    """The demo tenant (created if missing) and two new keys for it. Keys are stored
    hashed, so earlier runs' keys cannot be shown again: each start makes new ones."""
    from cronwheel.api.auth import generate_key

    try:
        tenant = await store.tenants_get_by_name(name=DEMO_TENANT)
    except NotFoundError:
        tenant = await store.tenants_create(name=DEMO_TENANT, limits={}, actor=_DEMO)
    keys: dict[str, str] = {}
    for role in ("operator", "worker"):
        key, key_hash, prefix = generate_key()
        await store.api_keys_create(
            tenant.id, role=role, key_hash=key_hash, prefix=prefix, actor=_DEMO
        )
        keys[role] = key
    return DemoKeys(str(tenant.id), keys["operator"], keys["worker"])


# -- jobs ----------------------------------------------------------------------------


Announce = Callable[[str], None]


async def create_demo_jobs(
    client: AsyncClient, jobs: tuple[DemoJob, ...], announce: Announce
) -> list[dict[str, Any]]:
    """Create each demo job once (a restart finds the ones made before)."""
    made = []
    for job in jobs:
        created = await client.jobs.create(
            name=job.name,
            schedule=job.schedule,
            task=job.task,
            payload=job.payload,
            retry=job.retry,
            tags=["demo"],
            idempotency_key=f"demo:{job.name}:{job.every}",
        )
        announce(f"recurring job {job.name} → {job.task}, {job.every} ({created['id']})")
        made.append(created)
    return made


# -- the whole demo ------------------------------------------------------------------


class Demo:
    """The runtime extra of ``cronwheel demo``."""

    def __init__(self, *, announce: Announce, jobs: tuple[DemoJob, ...] = DEMO_JOBS) -> None:
        self.announce = announce
        self.jobs = jobs
        self.keys: DemoKeys | None = None
        self.worker: Worker | None = None

    async def __call__(self, runtime: Runtime, stop: asyncio.Event) -> None:
        assert runtime.url is not None, "the demo needs the API"
        self.keys = await ensure_demo_tenant(runtime.store)
        self.announce_keys(runtime)
        self.worker = demo_worker(runtime.url, self.keys.worker_key)
        async with AsyncClient(runtime.url, api_key=self.keys.operator_key) as client:
            await create_demo_jobs(client, self.jobs, self.announce)
        try:
            await self.worker.run_async(stop)
        finally:
            stop.set()

    def announce_keys(self, runtime: Runtime) -> None:
        assert self.keys is not None
        self.announce(f"tenant {DEMO_TENANT}: {self.keys.tenant_id}")
        self.announce(f"operator key: {self.keys.operator_key}")
        self.announce(f"worker key:   {self.keys.worker_key}")
        self.announce(
            f"try: CRONWHEEL_URL={runtime.url} "
            f"CRONWHEEL_API_KEY={self.keys.operator_key} cronwheel runs list"
        )
