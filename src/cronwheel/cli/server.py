"""The commands that run cronwheel's processes — ``server``, ``api``, ``scheduler``,
``demo``, ``worker`` (the root app of :mod:`cronwheel.cli` holds them) — and
``cronwheel db upgrade``, which prepares their database."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cronwheel.cli.options import DEFAULT_URL, UrlOpt
from cronwheel.cli.output import command_group, console, err, fail, handle_errors, setup_logging
from cronwheel.runtime import Runtime, StartupError
from cronwheel.settings import Settings
from cronwheel.store.values import Migrated

__all__ = [
    "DataDirOpt",
    "DatabaseUrlOpt",
    "HostOpt",
    "LogLevelOpt",
    "PortOpt",
    "api",
    "db_app",
    "db_upgrade",
    "demo",
    "scheduler",
    "server",
    "worker",
]

db_app = command_group("The database: migrations.")


HostOpt = Annotated[
    str | None,
    typer.Option("--host", envvar=None, show_default="127.0.0.1", help="Listen address."),
]
PortOpt = Annotated[
    int | None,
    typer.Option(
        "--port",
        min=0,
        max=65535,
        show_default="8000",
        help="Listen port (0: any free one).",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        show_default="~/.cronwheel",
        file_okay=False,
        help="Where the SQLite database and the admin key live.",
    ),
]
DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        show_default="SQLite in the data directory",
        help="The database: a postgresql://… or sqlite:///… URL.",
    ),
]
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="debug | info | warning | error")]


def _settings(**flags: object) -> Settings:
    """Environment (CRONWHEEL_*) first, flags over it; a bad value is a clear error."""
    with handle_errors():
        return Settings.load(**flags)
    raise AssertionError("unreachable")  # handle_errors exits on every error


def _redacted(url: str) -> str:
    """A database URL fit to print: no password."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url


def _serve(runtime: Runtime, what: str) -> None:
    """Run a runtime in the foreground with a status line; Ctrl-C / SIGTERM stop it."""

    async def announce(rt: Runtime, stop: asyncio.Event) -> None:
        where = rt.url or _redacted(rt.settings.resolved_database_url)
        console.print(
            f"[bold green]cronwheel {what}[/] ready on [bold]{escape(where)}[/] "
            f"(pid {os.getpid()}; Ctrl-C to stop)",
            highlight=False,
        )
        if rt.metrics_address is not None:
            host, port = rt.metrics_address
            console.print(f"metrics on http://{escape(host)}:{port}/metrics", highlight=False)
        if rt.admin is not None:
            if rt.admin.created:
                kept = (
                    f", kept in {rt.admin.path}"
                    if rt.admin.path is not None
                    else "; only its hash is kept, in the database"
                )
                console.print(
                    f"admin key (shown once{kept}): [bold]{rt.admin.key}[/]", highlight=False
                )
            elif rt.admin.path is not None:
                console.print(f"admin key: in {rt.admin.path}", highlight=False)
            elif rt.admin.key is not None:
                console.print("admin key: from CRONWHEEL_ADMIN_KEY", highlight=False)
            else:
                console.print(
                    "admin key: the database's (shown once, by the process that made it)",
                    highlight=False,
                )
        await stop.wait()

    runtime.extras.insert(0, announce)
    try:
        runtime.run()
    except StartupError as exc:
        fail(str(exc))
    except KeyboardInterrupt:  # a signal before the handlers were installed
        raise typer.Exit(130) from None
    except Exception as exc:
        logging.getLogger("cronwheel").exception(
            "runtime.failed", extra={"event": "runtime.failed"}
        )
        fail(f"cronwheel {what} failed: {type(exc).__name__}: {exc}")
    console.print(f"cronwheel {what} stopped", highlight=False)


def server(
    host: HostOpt = None,
    port: PortOpt = None,
    data_dir: DataDirOpt = None,
    database_url: DatabaseUrlOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """The API, a scheduler node and the built-in webhook worker in one process (SQLite
    by default): the single-machine cronwheel. Creates the data directory, migrates the
    database and, unless CRONWHEEL_ADMIN_KEY is set, makes an admin key and prints it
    once. The webhook worker serves the pools of CRONWHEEL_WEBHOOK_POOLS (default:
    default; empty: none) and reaches private addresses only as CRONWHEEL_WEBHOOK_ALLOW
    admits."""
    setup_logging(log_level)
    settings = _settings(host=host, port=port, data_dir=data_dir, database_url=database_url)
    _serve(Runtime(settings, webhooks=True), "server")


def api(
    host: HostOpt = None,
    port: PortOpt = None,
    data_dir: DataDirOpt = None,
    database_url: DatabaseUrlOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """The API only (run scheduler nodes separately). Keeps nothing of its own: run
    several, each with its own data directory, behind a balancer. Unless
    CRONWHEEL_ADMIN_KEY is set, the first to start on an empty database makes the admin
    key (kept hashed in the database) and prints it once."""
    setup_logging(log_level)
    settings = _settings(host=host, port=port, data_dir=data_dir, database_url=database_url)
    _serve(Runtime(settings, scheduler=False), "api")


def scheduler(
    node_id: Annotated[
        str | None,
        typer.Option("--node-id", show_default="host:pid", help="This node's name."),
    ] = None,
    data_dir: DataDirOpt = None,
    database_url: DatabaseUrlOpt = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            show_default=False,
            help="Serve Prometheus metrics (dispatch lateness, clock offset, shards held) "
            "on this port, at /metrics, to CRONWHEEL_METRICS_TOKEN or CRONWHEEL_ADMIN_KEY "
            "as a bearer token.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="The address the metrics port binds.")
    ] = "127.0.0.1",
    log_level: LogLevelOpt = "info",
) -> None:
    """A scheduler node only: owns shards, fires due runs, expires lost leases."""
    setup_logging(log_level)
    settings = _settings(data_dir=data_dir, database_url=database_url, node_id=node_id)
    address = None
    if metrics_port is not None:
        if not (settings.metrics_token or settings.admin_key):
            fail(
                "--metrics-port: /metrics answers only to a bearer token: set "
                "CRONWHEEL_METRICS_TOKEN (or CRONWHEEL_ADMIN_KEY)",
                code=2,
            )
        address = (metrics_host, metrics_port)
    runtime = Runtime(
        settings, api=False, node_id=node_id or settings.node_id, metrics_address=address
    )
    _serve(runtime, "scheduler")


@db_app.command("upgrade")
def db_upgrade(
    database_url: DatabaseUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Apply every pending migration."""
    settings = _settings(database_url=database_url, data_dir=data_dir)
    url = settings.resolved_database_url

    async def upgrade() -> Migrated:
        from cronwheel.store import create_store

        if not settings.database_url:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = create_store(url)
        try:
            return await store.migrate()
        finally:
            await store.close()

    where = escape(_redacted(url))
    with err.status(f"migrating {where} …"):
        try:
            done = asyncio.run(upgrade())
        except Exception as exc:
            fail(f"cannot migrate {_redacted(url)}: {type(exc).__name__}: {exc}")
    if done.steps == 0:
        console.print(
            f"[green]already up to date[/] at revision {done.after}: {where}", highlight=False
        )
        return
    start = "an empty database" if done.before is None else f"revision {done.before}"
    noun = "migration" if done.steps == 1 else "migrations"
    console.print(
        f"[green]migrated[/] {where} from {start} to revision {done.after} ({done.steps} {noun})",
        highlight=False,
    )


def demo(
    host: HostOpt = None,
    port: PortOpt = None,
    data_dir: DataDirOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """The server plus a demo tenant, a worker and a stream of demo jobs (some fail once
    and succeed on retry), all in this process. Prints the keys to explore with
    `cronwheel jobs list` / `cronwheel runs list`."""
    from cronwheel.demo import Demo

    setup_logging(log_level)
    settings = _settings(host=host, port=port, data_dir=data_dir)

    def announce(line: str) -> None:
        console.print(f"[cyan]demo[/] {escape(line)}", highlight=False)

    runtime = Runtime(settings, extras=[Demo(announce=announce)])
    _serve(runtime, "demo")


def worker(
    modules: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            help="A module to import for its handlers (repeatable).",
            show_default=False,
        ),
    ] = None,
    webhook: Annotated[
        bool,
        typer.Option(
            "--webhook",
            help="Call webhooks: the built-in webhook worker (no --import needed).",
        ),
    ] = False,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="With --webhook: a CIDR or host name webhooks may reach although it is "
            "private, loopback… (repeatable).",
            show_default="CRONWHEEL_WEBHOOK_ALLOW",
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="CRONWHEEL_API_KEY",
            show_default=False,
            help="A worker key (of a tenant, or without one to serve every tenant).",
        ),
    ] = None,
    pool: Annotated[str, typer.Option("--pool", help="The pool to serve.")] = "default",
    capability: Annotated[
        list[str] | None,
        typer.Option(
            "--capability", help="A capability this worker has (repeatable).", show_default=False
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            help="An execution tag (repeatable): the worker leases runs whose route tags "
            "are all among its tags.",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=10_000, help="Handlers running at once.")
    ] = 10,
    name: Annotated[
        str | None,
        typer.Option("--name", show_default=False, help="A name shown in the dashboard."),
    ] = None,
    grace_period: Annotated[
        float,
        typer.Option("--grace-period", min=0, help="Seconds running handlers get on shutdown."),
    ] = 30.0,
    lease_ahead: Annotated[
        float | None,
        typer.Option(
            "--lease-ahead",
            min=0,
            show_default=False,
            help="Reserve runs dispatched ahead of their instant up to this many seconds "
            "early and start them at it (default: as far as the server allows; 0: never).",
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=0,
            max=10_000,
            show_default=False,
            help="The most leased runs held waiting for a slot while every slot is busy, "
            "about what the handlers finish in 0.2 s (default: twice the concurrency; 0: none).",
        ),
    ] = None,
    reserve: Annotated[
        int | None,
        typer.Option(
            "--reserve",
            min=0,
            max=100_000,
            show_default=False,
            help="The most reservations held beyond the free slots, about what the slots "
            "begin in 2 s once the handlers' duration is known (default: 10,000; 0: each "
            "reservation holds a slot).",
        ),
    ] = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """Run a Python worker.

    The imported modules register handlers on the global registry:

        from cronwheel.worker import task

        @task("billing.charge")
        async def charge(ctx, payload): ...

    (a module-level `worker = Worker(...)` with `@worker.task` handlers works too: its
    handlers are taken, its connection settings are not — this command's are.)
    The worker declares its handlers' task names when it registers and is leased runs
    of those tasks only. Sync handlers run in a thread pool, async ones on the event
    loop. SIGTERM / Ctrl-C stop leasing and let running handlers finish for
    --grace-period seconds; a second signal hands their runs back at once.

    --webhook runs the built-in webhook worker: it calls the URL of each webhook run
    (with --import too, the same worker also runs those tasks).
    """
    from cronwheel.worker import Worker, registry
    from cronwheel.worker.webhook import WebhookCaller

    setup_logging(log_level)
    modules = modules or []
    if not api_key:
        fail("no API key: pass --api-key or set CRONWHEEL_API_KEY (a worker key)", code=2)
    if not modules and not webhook:
        fail("nothing to run: pass --import MODULE (handlers) or --webhook", code=2)
    if allow and not webhook:
        fail("--allow applies to webhooks: pass --webhook too", code=2)
    caller: WebhookCaller | None = None
    if webhook:
        settings = _settings(webhook_allow=allow or None)
        caller = WebhookCaller(allow=settings.webhook_allow, timeout=settings.webhook_timeout)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: local modules import
    found = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            fail(f"--import {module_name}: {type(exc).__name__}: {exc}")
        found.append(module)
    try:
        w = Worker(
            url,
            api_key=api_key,
            pool=pool,
            capabilities=capability or [],
            tags=tag or [],
            concurrency=concurrency,
            name=name,
            grace_period=grace_period,
            webhook=caller,
            lease_ahead=lease_ahead,
            prefetch=prefetch,
            reserve=reserve,
        )
        if modules:
            w.include(registry)
        for module in found:
            module_worker = getattr(module, "worker", None)
            if isinstance(module_worker, Worker):
                w.include(module_worker.registry)
    except ValueError as exc:
        fail(str(exc), code=2)
    if modules and not len(w.registry):
        fail(
            f"no handlers: {', '.join(modules)} registered none (use "
            '@cronwheel.worker.task("name"))'
        )
    does = [f"tasks: {', '.join(w.registry.names())}"] if len(w.registry) else []
    if caller is not None:
        does.append("webhooks")
    console.print(
        f"[bold green]cronwheel worker[/] pool [bold]{escape(pool)}[/] → "
        f"{escape(url)}; {escape('; '.join(does))} "
        f"(concurrency {concurrency}; Ctrl-C to stop)",
        highlight=False,
    )
    # What start-up made (modules, the handlers, the client) lives as long as the
    # process: out of the collector's sight, a burst's thousands of new attempts do not
    # make each full collection walk it all again (as ``cronwheel api`` does).
    gc.freeze()
    with handle_errors():
        w.run()
    console.print(
        f"worker stopped: {w.stats.succeeded} succeeded, {w.stats.failed} failed, "
        f"{w.stats.released} released",
        highlight=False,
    )
