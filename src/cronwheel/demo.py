"""``cronwheel demo``: a server with something to look at.

Inside the server's process, once it is ready:

- a ``demo`` tenant (made through the store if missing) with a fresh operator key and
  a fresh worker key;
- an SDK :class:`~cronwheel.worker.Worker` connected to the server over HTTP, with
  handlers that succeed, fail once then succeed, and run as sync code;
- a *feeder* that keeps jobs coming. Each :class:`DemoJob` says how often it should
  run. :class:`RecurringFeeder` creates each one once as an ``interval`` job;
  while the API does not accept recurring schedules yet, :class:`OneOffFeeder` stands
  in, creating a one-off job (``delay``) per occurrence. :func:`choose_feeder` picks
  the recurring one as soon as the server accepts it, so nothing here changes when
  cron lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cronwheel.client import ApiError, AsyncClient
from cronwheel.domain.errors import NotFoundError
from cronwheel.runtime import Runtime
from cronwheel.store import Store
from cronwheel.worker import NonRetryableError, TaskContext, Worker
from cronwheel.worker.outbox import wait_event

__all__ = [
    "DEMO_JOBS",
    "DEMO_TENANT",
    "Announce",
    "Demo",
    "DemoJob",
    "DemoKeys",
    "Feeder",
    "OneOffFeeder",
    "RecurringFeeder",
    "choose_feeder",
    "demo_worker",
    "ensure_demo_tenant",
]

log = logging.getLogger("cronwheel.demo")

DEMO_TENANT = "demo"


@dataclass(frozen=True, slots=True)
class DemoJob:
    name: str
    task: str
    every: float  # seconds between occurrences
    delay: float = 3.0  # one-off stand-in: how long after creation it is due
    payload: dict[str, Any] = field(default_factory=dict)
    retry: dict[str, Any] | None = None


DEMO_JOBS: tuple[DemoJob, ...] = (
    DemoJob("demo-hello", "demo.hello", every=5.0, payload={"greeting": "hello"}),
    DemoJob(
        "demo-flaky",
        "demo.flaky",
        every=10.0,
        retry={"max_attempts": 3, "initial_delay": 1.0, "jitter": "none"},
    ),
    DemoJob("demo-report", "demo.report", every=15.0, payload={"rows": 1000}),
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
        tenant = await store.tenants_create(name=DEMO_TENANT, limits={}, actor="demo")
    keys: dict[str, str] = {}
    for role in ("operator", "worker"):
        key, key_hash, prefix = generate_key()
        await store.api_keys_create(tenant.id, role=role, key_hash=key_hash, prefix=prefix)
        keys[role] = key
    return DemoKeys(str(tenant.id), keys["operator"], keys["worker"])


# -- feeders -------------------------------------------------------------------------


class Feeder(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


Announce = Callable[[str], None]


class RecurringFeeder:
    """Creates each demo job once as a recurring (interval) job; idempotency keys make
    a restart find the jobs it made before instead of duplicating them."""

    def __init__(self, client: AsyncClient, jobs: tuple[DemoJob, ...], announce: Announce):
        self.client, self.jobs, self.announce = client, jobs, announce

    async def create(self, job: DemoJob) -> dict[str, Any]:
        return await self.client.jobs.create(
            name=job.name,
            schedule={"interval": job.every},
            task=job.task,
            payload=job.payload,
            retry=job.retry,
            tags=["demo"],
            idempotency_key=f"demo:{job.name}:interval:{job.every:g}",
        )

    async def run(self, stop: asyncio.Event) -> None:
        for job in self.jobs:
            created = await self.create(job)
            self.announce(f"recurring job {job.name} every {job.every:g} s ({created['id']})")
        await stop.wait()


class OneOffFeeder:
    """Stands in for recurring jobs: one one-off job per occurrence of each demo job."""

    def __init__(self, client: AsyncClient, jobs: tuple[DemoJob, ...], announce: Announce):
        self.client, self.jobs, self.announce = client, jobs, announce
        self._seq = itertools.count(1)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_at = {job.name: loop.time() for job in self.jobs}
        while not stop.is_set():
            now = loop.time()
            for job in self.jobs:
                if next_at[job.name] <= now:
                    next_at[job.name] = now + job.every
                    await self._create(job)
            await wait_event(stop, max(0.0, min(next_at.values()) - now))

    async def _create(self, job: DemoJob) -> None:
        name = f"{job.name}-{next(self._seq)}"
        try:
            created = await self.client.jobs.create(
                name=name,
                schedule={"delay": job.delay},
                task=job.task,
                payload=job.payload,
                retry=job.retry,
                tags=["demo"],
            )
        except ApiError as exc:
            log.warning(
                "demo job not created: %s", exc, extra={"event": "demo.create_failed", "job": name}
            )
            return
        self.announce(
            f"job {name} → {job.task} due in {job.delay:g} s (run {created.get('first_run_id')})"
        )


async def choose_feeder(
    client: AsyncClient, jobs: tuple[DemoJob, ...], announce: Announce
) -> Feeder:
    """Recurring jobs when the server takes them, one-off stand-ins otherwise."""
    recurring = RecurringFeeder(client, jobs, announce)
    try:
        await recurring.create(jobs[0])
    except ApiError as exc:
        if exc.status in (400, 422) and (exc.field or "").startswith("schedule"):
            return OneOffFeeder(client, jobs, announce)
        raise
    return recurring


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
            feeder = await choose_feeder(client, self.jobs, self.announce)
            worker_task = asyncio.create_task(self.worker.run_async(stop), name="demo-worker")
            feeder_task = asyncio.create_task(feeder.run(stop), name="demo-feeder")
            try:
                await asyncio.gather(worker_task, feeder_task)
            finally:
                stop.set()
                for task in (worker_task, feeder_task):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def announce_keys(self, runtime: Runtime) -> None:
        assert self.keys is not None
        self.announce(f"tenant {DEMO_TENANT}: {self.keys.tenant_id}")
        self.announce(f"operator key: {self.keys.operator_key}")
        self.announce(f"worker key:   {self.keys.worker_key}")
        self.announce(
            f"try: CRONWHEEL_URL={runtime.url} "
            f"CRONWHEEL_API_KEY={self.keys.operator_key} cronwheel runs list"
        )
