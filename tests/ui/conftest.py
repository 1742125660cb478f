"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against a real server — API and scheduler on their own thread — with a
Python worker running the jobs. Skipped, saying why, where Chromium is not installed.

One server, worker and browser serve the whole module: starting them is most of the
time a test would take.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cronwheel import Client
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings, normalise_database_url
from cronwheel.worker import NonRetryableError, TaskContext, Worker

CHROMIUM = "/usr/bin/chromium"
ADMIN = "ui-admin-key-0123456789"


@dataclass
class Site:
    url: str
    admin: Client
    tenant_a: dict[str, Any]  # with its operator key, "api_key"
    tenant_b: dict[str, Any]
    viewer_key: str

    @property
    def operator(self) -> Client:
        return self.admin.with_tenant(self.tenant_a["id"])


# Gates a test opens to let a ``ui.follow`` run go on: by name, made by whichever side
# comes first.
_GATES: dict[str, threading.Event] = {}


def gate(name: str) -> threading.Event:
    return _GATES.setdefault(name, threading.Event())


def _start_worker(url: str, key: str) -> Callable[[], None]:
    """A worker on its own thread running the test tasks; returns what stops it."""
    worker = Worker(url, api_key=key, lease_wait=0.5, name="ui-test-worker", concurrency=4)

    @worker.task("ui.ok")
    def ok(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        ctx.log.info("all good for %s", payload.get("who", "nobody"))
        return {"ok": True}

    @worker.task("ui.fail")
    def fail(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.log.info("about to fail on purpose")
        raise NonRetryableError("the disk is full (on purpose)")

    @worker.task("ui.flaky")
    def flaky(ctx: TaskContext, payload: dict[str, Any]) -> str:
        if ctx.attempt == 1:  # the first series gives up; a redriven one succeeds
            raise RuntimeError("upstream said 503")
        return "second time lucky"

    @worker.task("ui.follow")
    def follow(ctx: TaskContext, payload: dict[str, Any]) -> str:
        """Logs a line, then one more each time the test opens the next gate."""
        ctx.log.info("before the gates")
        for name in payload["gates"]:
            if not gate(name).wait(60):
                raise NonRetryableError(f"gate {name} never opened")
            ctx.log.info("through gate %s", name)
        return "all gates passed"

    started = threading.Event()
    loop_and_halt: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def run() -> None:
        halt = asyncio.Event()
        loop_and_halt.append((asyncio.get_running_loop(), halt))
        started.set()
        await worker.run_async(halt)

    thread = threading.Thread(target=lambda: asyncio.run(run()), name="ui-worker", daemon=True)
    thread.start()
    started.wait(10)

    def stop() -> None:
        for loop, halt in loop_and_halt:
            loop.call_soon_threadsafe(halt.set)
        thread.join(30)

    return stop


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    data = tmp_path_factory.mktemp("ui-site")
    settings = Settings(
        database_url=normalise_database_url(f"sqlite:///{data / 'cronwheel.db'}"),
        data_dir=data,
        port=0,
        admin_key=ADMIN,
    )
    with BackgroundRuntime(Runtime(settings)) as server, Client(server.url, api_key=ADMIN) as admin:
        a = admin.tenants.create(f"team-a-{uuid.uuid4().hex[:4]}")
        b = admin.tenants.create(f"team-b-{uuid.uuid4().hex[:4]}")
        viewer = admin.tenants.create_key(a["id"], role="viewer")["api_key"]
        worker_key = admin.tenants.create_key(a["id"], role="worker")["api_key"]
        stop_worker = _start_worker(server.url, worker_key)
        try:
            yield Site(server.url, admin, a, b, viewer)
        finally:
            stop_worker()


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
