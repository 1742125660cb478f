"""cronwheel in one process: the store, the HTTP API (uvicorn) and a scheduler node on
one event loop — what ``cronwheel server``, ``api``, ``scheduler`` and ``demo`` run.

::

    prepare():  settings ─▶ data dir ─▶ open store ─▶ migrate ─▶ admin key
    serve(stop):
        api ─────────┐
        scheduler ───┤
        webhooks ────┼── run until ``stop`` is set or one of them fails
        extras ──────┘   (extras — the webhook workers, the demo — stop first, then the
                          API, then the scheduler, then the store closes)

The webhook workers (``cronwheel server``: ``webhooks=True``) are built-in workers, one
per pool of the setting ``webhook_pools``, that call the process's own API with its
admin key, like any other worker.

uvicorn runs programmatically and never installs signal handlers of its own: the
caller owns the signals (``run()`` maps SIGTERM/SIGINT to ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from cronwheel import eventloop
from cronwheel.settings import Settings
from cronwheel.store import Store, create_store

__all__ = [
    "ADMIN_KEY_FILE",
    "AdminKey",
    "BackgroundRuntime",
    "Extra",
    "Runtime",
    "StartupError",
    "ensure_admin_key",
    "serving",
]

log = logging.getLogger("cronwheel.runtime")

ADMIN_KEY_FILE = "admin.key"
_STOP_TIMEOUT = 15.0

Extra = Callable[["Runtime", asyncio.Event], Coroutine[Any, Any, None]]
"""Something else to run in the process once it is ready (the demo), until stop."""


# Objects made between two collections of the youngest generation (Python's default: 700).
_YOUNG_GC = 10_000


class StartupError(RuntimeError):
    """The process cannot start: a port in use, a database out of reach, …"""


@dataclass(frozen=True, slots=True)
class AdminKey:
    key: str | None  # None: the database's, which this process never saw
    created: bool  # True when generated just now: the only time it is shown
    path: Path | None  # the file it is kept in (None: the environment, or not kept)


async def ensure_admin_key(settings: Settings, store: Store) -> AdminKey:
    """The admin key: ``settings.admin_key`` (``CRONWHEEL_ADMIN_KEY``), else the
    deployment's bootstrap admin key, which lives hashed in the database so that every
    API node knows it, and is made once — by the first process that finds none (of
    processes starting at once, exactly one makes it; the others find it).

    Its plaintext is shown once, by the process that made it. On SQLite (one machine)
    it is also kept in ``<data_dir>/admin.key``, readable by the owner only, as it
    always was; on PostgreSQL it is kept nowhere. A key file found in the data directory
    becomes the bootstrap key of a database that has none (an upgrade keeps its admin
    key); a file holding another key than the database's is ignored, with a warning.
    """
    if settings.admin_key:
        return AdminKey(settings.admin_key, created=False, path=None)
    from cronwheel.api.auth import generate_key, hash_key

    path = settings.data_dir / ADMIN_KEY_FILE
    kept = _read_key(path)
    keep_file = store.dialect == "sqlite"
    if kept is not None:
        key, key_hash, prefix = kept, hash_key(kept), kept[:10]
    else:
        key, key_hash, prefix = generate_key()
        if keep_file:  # written first: a key in the database is never one nobody has
            _write_key(path, key)
    try:
        record, created = await store.api_keys_bootstrap(key_hash=key_hash, prefix=prefix)
    except BaseException:
        if kept is None and keep_file:
            path.unlink(missing_ok=True)
        raise
    if created:
        return AdminKey(key, created=kept is None, path=path if keep_file or kept else None)
    if kept is None and keep_file:
        path.unlink(missing_ok=True)  # the database has another: ours was never used
    if kept is not None:
        known = await store.api_keys_get_by_hash(key_hash=key_hash)
        if known is not None and known.id == record.id:
            return AdminKey(kept, created=False, path=path)
        log.warning(
            "the admin key in %s is not this database's admin key: ignored",
            path,
            extra={"event": "runtime.admin_key_ignored", "path": str(path)},
        )
    return AdminKey(None, created=False, path=None)


def _read_key(path: Path) -> str | None:
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text(encoding="utf-8").strip()
        if key:
            return key
    return None


def _write_key(path: Path, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that existed


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the runtime decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int, *, what: str = "listen") -> socket.socket:
    """Bind before starting uvicorn, so a port in use is a clear error and port 0
    gives the actual port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve host {host!r}: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot {what} on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def _url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _uvicorn_config(app: Any, settings: Settings | None = None) -> uvicorn.Config:
    """uvicorn for ``app``, with the request-head limits of ``settings`` (default
    settings when None) enforced while it parses, and no WebSocket upgrades (cronwheel
    has no WebSocket route)."""
    from cronwheel.api.head_limits import HeadLimits, uvicorn_options

    limits = HeadLimits.of(settings or Settings.model_construct())
    return uvicorn.Config(
        app,
        ws="none",
        **uvicorn_options(limits),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        proxy_headers=False,
        server_header=False,
    )


@contextlib.asynccontextmanager
async def serving(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, settings: Settings | None = None
) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on the running loop for the duration of the block;
    yields its URL (``port=0``: a free port). ``settings``: its request-head limits."""
    sock = _bind(host, port)
    server = _Server(_uvicorn_config(app, settings))
    task = asyncio.create_task(Runtime._serve_api(server, sock), name="cronwheel-serving")
    try:
        await Runtime._wait_started(server, task)
        yield _url_of(sock, host)
    finally:
        server.should_exit = True
        await task


class Runtime:
    """One cronwheel process. Call :meth:`prepare`, then :meth:`serve`."""

    def __init__(
        self,
        settings: Settings,
        *,
        api: bool = True,
        scheduler: bool = True,
        node_id: str | None = None,
        extras: list[Extra] | None = None,
        webhooks: bool = False,
        metrics_address: tuple[str, int] | None = None,
    ) -> None:
        """``metrics_address``: serve ``GET /metrics`` on its own port there (for a
        process without the API), to the metrics token or the admin key only."""
        self.settings = settings
        self.with_api = api
        self.with_scheduler = scheduler
        self.node_id = node_id
        self.extras = list(extras or [])
        if webhooks and api:
            self.extras.append(_webhook_workers)
        self.admin: AdminKey | None = None
        self.url: str | None = None
        self.ready = asyncio.Event()
        self._store: Store | None = None
        self.metrics_address = metrics_address
        self._metrics_sock: socket.socket | None = None
        # Set by :meth:`run` (a process of its own): see :meth:`serve`.
        self._freeze_gc = False

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the runtime is not prepared")
        return self._store

    async def prepare(self) -> None:
        """The metrics port, data directory, store (opened and migrated) and, for the
        API, the admin key."""
        self._bind_metrics()
        try:
            await self._prepare_store()
        except BaseException:
            if self._metrics_sock is not None:
                self._metrics_sock.close()
                self._metrics_sock = None
            raise

    def _bind_metrics(self) -> None:
        if self.metrics_address is None or self._metrics_sock is not None:
            return
        if not (self.settings.metrics_token or self.settings.admin_key):
            raise StartupError(
                "the metrics port answers only to the metrics token or the admin key: "
                "set CRONWHEEL_METRICS_TOKEN (or CRONWHEEL_ADMIN_KEY)"
            )
        host, port = self.metrics_address
        self._metrics_sock = _bind(host, port, what="serve metrics")

    async def _prepare_store(self) -> None:
        settings = self.settings
        if not settings.database_url:
            try:
                settings.data_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StartupError(
                    f"cannot create data directory {settings.data_dir}: {exc.strerror or exc}"
                ) from exc
        # A process frozen inside a transaction must not hold its locks past the time
        # its shards are taken over: the server ends such sessions well before that.
        store = create_store(
            settings.resolved_database_url,
            idle_transaction_timeout=min(5.0, settings.shard_lease_ttl / 2),
            # The API serves every worker: enough connections, ready before the first
            # burst, for the start statements it runs at once (see StartsFirst).
            pool_size=settings.api_pool_size if self.with_api else settings.db_pool_size,
            pool_overflow=settings.db_pool_overflow,
            warm=self.with_api,
            max_node_input_bytes=settings.node_input_limit,
        )
        try:
            await store.open()
            await store.migrate()
        except Exception as exc:
            await store.close()
            raise StartupError(f"cannot open the database: {exc}") from exc
        self._store = store
        if self.with_api:
            try:
                self.admin = await ensure_admin_key(settings, store)
            except Exception as exc:
                await store.close()
                self._store = None
                raise StartupError(f"cannot read or make the admin key: {exc}") from exc
            # The key this process compares requests with itself (no look-up), and the
            # one its built-in workers use: the admin key when this process knows it,
            # else a key of its own, never stored, that no other process accepts.
            from cronwheel.api.auth import generate_key

            own = self.admin.key or generate_key()[0]
            self.settings = settings.model_copy(update={"admin_key": own})

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (or a component fails), then shut down in order."""
        store = self.store
        core: list[asyncio.Task[Any]] = []
        extras: list[asyncio.Task[Any]] = []
        servers: list[_Server] = []
        scheduler_stop = asyncio.Event()
        try:
            if self._metrics_sock is not None:
                from cronwheel.api.metrics import MetricsApp

                metrics = _Server(_uvicorn_config(MetricsApp(self.settings), self.settings))
                servers.append(metrics)
                core.append(
                    asyncio.create_task(
                        self._serve_api(metrics, self._metrics_sock), name="cronwheel-metrics"
                    )
                )
                self._metrics_sock = None  # closed by the server when it stops
                await self._wait_started(metrics, core[-1])
            if self.with_api:
                server, sock = self._make_api(store)
                servers.append(server)
                core.append(
                    asyncio.create_task(self._serve_api(server, sock), name="cronwheel-api")
                )
                await self._wait_started(server, core[-1])
            if self.with_scheduler:
                from cronwheel.scheduler.node import SchedulerNode

                node = SchedulerNode(store, self.settings, node_id=self.node_id)
                core.append(
                    asyncio.create_task(node.run(scheduler_stop), name="cronwheel-scheduler")
                )
            if self._freeze_gc:
                # What start-up made (modules, the app, the pool) lives as long as the
                # process: moved out of the collector's sight, a full collection — which
                # a batch of creates sets off every few requests — walks only what
                # requests made since, not the whole heap again (30 % of a 1,000-job
                # batch's time before). And the youngest generation is collected every
                # 10,000 new objects, not 700: most of what a request makes is gone by
                # then, instead of moved to an older generation to be walked again (a
                # 1,000-job batch: 7 % faster).
                gc.freeze()
                gc.set_threshold(_YOUNG_GC, *gc.get_threshold()[1:])
            self.ready.set()
            shown: dict[str, str] = {}
            if self.url is not None:
                shown["api"] = self.url
            if self.with_scheduler:
                shown["scheduler"] = self.node_id or "on"
            log.info(
                "runtime.ready %s",
                " ".join(f"{k}={v}" for k, v in shown.items()),
                extra={"event": "runtime.ready", **shown},
            )
            extras = [
                asyncio.create_task(extra(self, stop), name="cronwheel-extra")
                for extra in self.extras
            ]
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait(
                {stopper, *core, *extras}, return_when=asyncio.FIRST_COMPLETED
            )
            stopper.cancel()
            errors = [t.exception() for t in done if t is not stopper and not t.cancelled()]
            stop.set()
            await self._stop_all(extras, servers, core, scheduler_stop)
            for error in errors:
                if error is not None:
                    raise error
        finally:
            for task in (*extras, *core):
                task.cancel()
            if self._metrics_sock is not None:  # never handed to a server
                self._metrics_sock.close()
            await store.close()
            log.info("runtime.stopped", extra={"event": "runtime.stopped"})

    def _make_api(self, store: Store) -> tuple[_Server, socket.socket]:
        from cronwheel.api.app import create_app

        sock = _bind(self.settings.host, self.settings.port)
        self.url = _url_of(sock, self.settings.host)
        app = create_app(self.settings, store)
        return _Server(_uvicorn_config(app, self.settings)), sock

    @staticmethod
    async def _serve_api(server: _Server, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits on a failed start-up
            raise StartupError("the HTTP server failed to start (see the log above)") from exc
        finally:
            sock.close()

    @staticmethod
    async def _wait_started(server: _Server, task: asyncio.Task[Any]) -> None:
        while not server.started:
            if task.done():
                task.result()
                raise StartupError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def _stop_all(
        self,
        extras: list[asyncio.Task[Any]],
        servers: list[_Server],
        core: list[asyncio.Task[Any]],
        scheduler_stop: asyncio.Event,
    ) -> None:
        # Extras (the demo's worker) talk to the API: let them finish first.
        if extras:
            await asyncio.wait(extras, timeout=_STOP_TIMEOUT)
        for server in servers:
            server.should_exit = True
        scheduler_stop.set()
        if core:
            _, pending = await asyncio.wait(core, timeout=_STOP_TIMEOUT)
            for task in pending:
                log.warning(
                    "component did not stop in time: %s",
                    task.get_name(),
                    extra={"event": "runtime.stop_timeout", "component": task.get_name()},
                )

    def run(self) -> None:
        """Prepare and serve until SIGTERM or SIGINT (blocking), on uvloop where it is
        installed (``cronwheel.eventloop``)."""
        self._freeze_gc = True
        eventloop.run(self._main())

    async def _main(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        try:
            await self.prepare()
            await self.serve(stop)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)


async def _webhook_workers(runtime: Runtime, stop: asyncio.Event) -> None:
    """The built-in webhook workers: one per pool of ``webhook_pools`` (none when it is
    empty), against this process's API with its admin key, until ``stop``."""
    from cronwheel.worker import webhook_worker

    settings = runtime.settings
    if not settings.webhook_pools or runtime.url is None or settings.admin_key is None:
        await stop.wait()  # an extra that returns would stop the whole process
        return
    workers = [
        webhook_worker(
            runtime.url,
            api_key=settings.admin_key,
            pool=pool,
            allow=settings.webhook_allow,
            timeout=settings.webhook_timeout,
            concurrency=settings.webhook_concurrency,
            name=f"webhooks:{pool}",
            # within the runtime's own stop timeout, so the API outlives their reports
            grace_period=min(settings.webhook_timeout, _STOP_TIMEOUT / 2),
        )
        for pool in dict.fromkeys(settings.webhook_pools)
    ]
    log.info(
        "runtime.webhooks pools=%s",
        ",".join(w.config.pool for w in workers),
        extra={"event": "runtime.webhooks", "pools": [w.config.pool for w in workers]},
    )
    await asyncio.gather(*(w.run_async(stop) for w in workers))


class BackgroundRuntime:
    """A :class:`Runtime` on its own thread and event loop: for embedding cronwheel in
    a blocking program (a notebook, a test of blocking code)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        if self.runtime.url is None:
            raise RuntimeError("the runtime serves no API")
        return self.runtime.url

    def start(self, timeout: float = 60.0) -> BackgroundRuntime:
        self._thread = threading.Thread(target=self._target, name="cronwheel-runtime", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise StartupError(f"the runtime did not start within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def _target(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            waiter = asyncio.create_task(self.runtime.ready.wait())
            try:
                await self.runtime.prepare()
                serving = asyncio.create_task(self.runtime.serve(self._stop))
                await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
                self._started.set()
                await serving
            finally:
                waiter.cancel()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._started.set()

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
            raise self._error

    def __enter__(self) -> BackgroundRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
