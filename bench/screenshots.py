"""Screenshots of the dashboard (docs/screenshots/*.png) with realistic data.

Starts a server (API + scheduler) on a fresh SQLite file and a Python worker, makes a
few tenants and jobs — cron jobs in several time zones, intervals, a paused one, one
that fails, a workflow whose run is caught midway — backfills the last hour of two of
them so the charts have something to show, lets the worker run everything, then opens
each page in headless Chromium.

    python bench/screenshots.py [--out docs/screenshots] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cronwheel import Client
from cronwheel.client.calls import Call
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings, normalise_database_url
from cronwheel.worker import NonRetryableError, TaskContext, Worker

ADMIN = "screenshots-admin-key-0123456789"
_RNG = random.Random(7)


def _worker(url: str, key: str, name: str, pool: str = "default") -> Callable[[], None]:
    worker = Worker(
        url, api_key=key, lease_wait=0.5, name=name, concurrency=8, pool=pool, grace_period=1.0
    )

    @worker.task("payments.settle")
    def settle(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        batch = _RNG.randint(40, 400)
        ctx.log.info("settling %d card transactions", batch)
        time.sleep(_RNG.uniform(0.01, 0.06))
        if _RNG.random() < 0.06:
            ctx.log.warning("acquirer answered 503, will retry")
            raise RuntimeError("acquirer unavailable: HTTP 503")
        ctx.log.info("settled %d transactions, 0 mismatches", batch)
        return {"settled": batch}

    @worker.task("payments.fx")
    def fx(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        ctx.log.info("fetched 32 currency pairs")
        time.sleep(_RNG.uniform(0.005, 0.03))
        if _RNG.random() < 0.03:
            raise NonRetryableError("rate source returned a stale quote")
        return {"pairs": 32}

    @worker.task("payments.ledger")
    def ledger(ctx: TaskContext, payload: dict[str, Any]) -> str:
        ctx.log.info("reconciling ledger for %s", payload.get("region", "eu"))
        return "balanced"

    @worker.task("payments.audit")
    async def audit(ctx: TaskContext, payload: dict[str, Any]) -> None:
        ctx.log.info("opening the audit export for %s", payload.get("day", "today"))
        ctx.log.info("scanning 1,204,332 ledger entries")
        await asyncio.sleep(0.4)
        ctx.log.warning("the ledger replica is 41 s behind; waiting for it")
        await asyncio.sleep(5)  # past the job's timeout: the attempt ends at its deadline

    @worker.task("payments.slow")
    def slow(ctx: TaskContext, payload: dict[str, Any]) -> None:
        for step in range(1, 61):
            ctx.log.info("copying partition %d of 60", step)
            time.sleep(0.5)

    started = threading.Event()
    handles: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def run() -> None:
        halt = asyncio.Event()
        handles.append((asyncio.get_running_loop(), halt))
        started.set()
        await worker.run_async(halt)

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    started.wait(10)

    def stop() -> None:
        for loop, halt in handles:
            loop.call_soon_threadsafe(halt.set)
        thread.join(10)

    return stop


def _data(admin: Client) -> dict[str, Any]:
    payments = admin.tenants.create(
        "payments", limits={"max_concurrent_runs": 200, "max_pending_runs": 100000}
    )
    admin.tenants.create("search", limits={"max_concurrent_runs": 50})
    admin.tenants.create("data-platform", limits={"max_dispatch_rate": 100, "dispatch_burst": 200})
    key = admin.tenants.create_key(payments["id"], role="worker")["api_key"]
    op = admin.with_tenant(payments["id"])
    retry = {"max_attempts": 3, "initial_delay": 0.2, "jitter": "none"}
    settle = op.jobs.create(
        name="settle-card-batches",
        schedule={"cron": "* * * * *"},
        task="payments.settle",
        retry=retry,
        tags=["finance"],
    )
    fx = op.jobs.create(
        name="refresh-fx-rates", schedule={"interval": 20}, task="payments.fx", tags=["market"]
    )
    ledger = op.jobs.create(
        name="reconcile-ledger",
        schedule={"cron": "30 2 * * *", "timezone": "Europe/Paris"},
        task="payments.ledger",
        payload={"region": "eu"},
    )
    op.jobs.create(
        name="send-dunning-emails",
        schedule={"cron": "0 9 * * mon-fri", "timezone": "America/New_York"},
        task="payments.ledger",
    )
    exports = op.jobs.create(
        name="export-to-warehouse", schedule={"interval": 900}, task="payments.ledger"
    )
    op.jobs.pause(exports["id"], reason="warehouse migration")
    audit = op.jobs.create(
        name="nightly-audit-export",
        schedule={"asap": True},
        task="payments.audit",
        payload={"day": "2026-12-04"},
        timeout=1.0,
        retry={"max_attempts": 3, "initial_delay": 0.2, "jitter": "none"},
    )
    for _ in range(2):
        op.jobs.trigger(audit["id"])
    slow = op.jobs.create(
        name="rebuild-search-index", schedule={"asap": True}, task="payments.slow"
    )
    now = datetime.now(UTC)
    for job in (settle, fx):
        op.jobs.backfill(job["id"], start=now - timedelta(minutes=58), end=now, rate=200)
    op.jobs.trigger(ledger["id"])
    made = {"tenant": payments, "worker_key": key, "audit": audit, "slow": slow, "op": op}
    return {**made, "ledger": ledger, "close_day": _workflow_run(op)}


def _workflow_run(op: Client) -> dict[str, Any]:
    """A workflow run caught midway: nodes done, one dead-lettered with the node after it
    skipped, one running, the last ones waiting."""
    ledger = {"task": "payments.ledger"}
    nodes = [
        {"name": "fetch-orders", **ledger},
        {"name": "fetch-refunds", **ledger},
        {"name": "refresh-fx", **ledger},
        {"name": "reconcile", **ledger, "after": ["fetch-orders", "fetch-refunds", "refresh-fx"]},
        {
            "name": "export-audit",
            "task": "payments.audit",
            "after": ["reconcile"],
            "timeout": 1.0,
            "retry": {"max_attempts": 1},
        },
        {"name": "publish-report", **ledger, "after": ["export-audit"]},
        {"name": "rebuild-search-index", "task": "payments.slow", "after": ["reconcile"]},
        {"name": "warm-caches", **ledger, "after": ["rebuild-search-index"]},
        {
            "name": "notify-finance",
            **ledger,
            "after": ["publish-report", "warm-caches"],
            "trigger_rule": "all_done",
        },
    ]
    body = {"name": "close-the-day", "schedule": {"cron": "0 23 * * *"}, "nodes": nodes}
    workflow = op.send(Call("POST", "/v1/workflows", json=body))
    return dict(op.send(Call("POST", f"/v1/workflows/{workflow['id']}/trigger")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--settle", type=float, default=12.0, help="seconds the worker runs first")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=normalise_database_url(f"sqlite:///{Path(tmp) / 'cw.db'}"),
            data_dir=Path(tmp),
            port=0,
            admin_key=ADMIN,
            node_id="scheduler-1",
        )
        with (
            BackgroundRuntime(Runtime(settings)) as server,
            Client(server.url, api_key=ADMIN) as admin,
        ):
            made = _data(admin)
            stops = [
                _worker(server.url, made["worker_key"], "payments-worker-1"),
                _worker(server.url, made["worker_key"], "payments-worker-2"),
            ]
            time.sleep(args.settle)
            op = made["op"]
            failed = next(
                r
                for r in op.runs.list(job_id=made["audit"]["id"]).items
                if r["state"] == "DEAD_LETTER"
            )
            shots = {
                "overview": "/ui/overview",
                "jobs": "/ui/jobs",
                "job": f"/ui/jobs/{made['ledger']['id']}",
                "runs": "/ui/runs",
                "run": f"/ui/runs/{failed['id']}",
                "run-live": f"/ui/runs/{made['slow']['first_run_id']}",
                "dead-letters": "/ui/dead-letters",
                "workers": "/ui/workers",
                "workflow-run": f"/ui/workflow-runs/{made['close_day']['id']}",
            }
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"]
                )
                context = browser.new_context(
                    base_url=server.url, viewport={"width": 1280, "height": 860}
                )
                page = context.new_page()
                page.goto("/ui/sign-in")
                page.screenshot(path=str(args.out / "sign-in.png"))
                page.fill("#api_key", made["tenant"]["api_key"])
                page.click("button:has-text('Sign in')")
                for name, path in shots.items():
                    page.goto(path)
                    page.wait_for_timeout(300)
                    page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
                admin_page = browser.new_context(
                    base_url=server.url, viewport={"width": 1280, "height": 860}
                ).new_page()
                admin_page.goto("/ui/sign-in")
                admin_page.fill("#api_key", ADMIN)
                admin_page.click("button:has-text('Sign in')")
                admin_page.wait_for_selector("table")
                admin_page.screenshot(path=str(args.out / "tenants.png"), full_page=True)
                browser.close()
            for stop in stops:
                stop()
    print(
        f"screenshots in {args.out}: " + ", ".join(sorted(p.name for p in args.out.glob("*.png")))
    )


if __name__ == "__main__":
    main()
