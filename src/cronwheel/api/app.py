"""The FastAPI application: ``create_app(settings, store)``.

The app does not own the store: the runtime opens and migrates it, hands it in, and
closes it after the app has shut down. The app owns only what it starts itself (the
shared wake-up subscription of lease long-polls), stopped by its lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRouter
from fastapi_offline import FastAPIOffline
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cronwheel.api import overview
from cronwheel.api.auth import KeyCache
from cronwheel.api.errors import AllowedMethods, error_response, install_error_handlers
from cronwheel.api.head_limits import HeadLimitMiddleware, HeadLimits
from cronwheel.api.key_rates import SharedKeyRates
from cronwheel.api.metrics import MetricsMiddleware, RunsByStateRefresher
from cronwheel.api.notifier import ReadyNotifier
from cronwheel.api.rate_limits import RateLimitMiddleware
from cronwheel.api.routers import (
    alerts,
    attempts,
    audit,
    bulk,
    health,
    job_edit,
    jobs,
    logs,
    overrides,
    pools,
    runs,
    tenants,
    workers,
    workflows,
)
from cronwheel.api.state import ApiState, StartsFirst
from cronwheel.logstore import FileLogStore, LogStore
from cronwheel.settings import Settings
from cronwheel.store.base import Store
from cronwheel.version import package_version

__all__ = ["BodyLimitMiddleware", "create_app", "default_log_store", "stop_long_polls"]

_DESCRIPTION = """\
cronwheel decides when a run is due and hands it to workers.

Authenticate with `Authorization: Bearer <key>`. With the admin key, requests about a
tenant's jobs and runs name the tenant in the `Cronwheel-Tenant` header.
Errors are JSON: `{"error": {"code": ..., "message": ..., "field": ...}}`.

Bodies are strict JSON (no `NaN` or `Infinity`, nesting at most 32 levels, no NUL or
unpaired surrogate in any string) and every value is bounded (each field's schema shows
its bounds); a value out of bounds is a 4xx naming the field, and nothing is written.

Every request: more than `max_header_count` headers (100), or a request line and
headers over `max_header_bytes` (32 KiB), is refused with 431
`request_headers_too_large` and the connection closed. Requests are rate limited per
API key (worker keys and the admin key far higher; a tenant's own `api_rate` per key,
shared by every API node, where the admin set one), and per client address without a
valid key: over the limit the answer is 429 `rate_limited` with `Retry-After`.
"""

_TAGS = [
    {"name": "tenants", "description": "Tenants and their API keys (admin key)."},
    {"name": "jobs", "description": "What should run, and when."},
    {"name": "runs", "description": "Each due occurrence of a job and its history."},
    {"name": "alerts", "description": "What needs attention now (runs no worker can take)."},
    {"name": "worker protocol", "description": "How workers lease and report runs."},
    {
        "name": "pools",
        "description": "Each pool's live capacity, its backlog, and the slots kept for P0.",
    },
    {"name": "operations", "description": "Probes and Prometheus metrics."},
]


class BodyLimitMiddleware:
    """Refuses request bodies over ``max_bytes`` with 413 before anything parses them.

    The job payload has its own, tighter limit (``max_payload_bytes``, checked on the
    parsed payload); this one bounds the memory any single request can take.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "payload_too_large",
            f"the request body exceeds {self.max_bytes} bytes",
        )
        await response(scope, receive, send)


async def stop_long_polls(app: FastAPI) -> None:
    """Answer every waiting long-poll (lease, cancels, gates) now and let no new one wait.

    Call it before stopping the HTTP server: a server shutting down gracefully waits for
    open requests, and a long-poll could otherwise hold it for ``lease_wait_max``.
    """
    state: ApiState = app.state.api
    await state.notifier.close()
    await state.cancels.close()
    await state.gates.close()


def default_log_store(settings: Settings, store: Store) -> LogStore:
    """The log store the settings name (``resolved_log_store``): files under
    ``resolved_log_dir``, or the database of ``store``."""
    if settings.resolved_log_store == "database":
        from cronwheel.logstore_db import DatabaseLogStore

        return DatabaseLogStore(
            store,
            max_bytes_per_attempt=settings.max_log_bytes_per_attempt,
            retention_days=settings.log_retention_days,
        )
    return FileLogStore(
        settings.resolved_log_dir, max_bytes_per_attempt=settings.max_log_bytes_per_attempt
    )


def create_app(settings: Settings, store: Store, *, log_store: LogStore | None = None) -> FastAPI:
    """The REST API over an open, migrated ``store``. Worker logs go to ``log_store``
    (default: :func:`default_log_store`)."""
    state = ApiState(
        settings=settings,
        store=store,
        key_cache=KeyCache(store, ttl=settings.key_cache_ttl),
        notifier=ReadyNotifier(store),
        runs_by_state=RunsByStateRefresher(
            store,
            pools=settings.metrics_pools,
            p0_reserved_share=settings.p0_reserved_share,
            worker_ttl=settings.worker_ttl,
        ),
        key_rates=SharedKeyRates(store),
        # As many start statements at once as the pool keeps connections for.
        starts=StartsFirst(statements=settings.api_pool_size),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Revocations made on any API node reach this one's key cache.
        subscribed = asyncio.Event()
        revocations = asyncio.create_task(
            state.key_cache.follow_revocations(subscribed), name="cronwheel-api-key-revocations"
        )
        await subscribed.wait()
        state.operations.start()
        try:
            yield
        finally:
            await state.operations.close()
            revocations.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await revocations
            await state.notifier.close()
            await state.cancels.close()
            await state.gates.close()

    # The docs pages (/docs, /redoc) load their scripts and styles from the package
    # (under /static-offline-docs), never from a CDN: they work without internet.
    app = FastAPIOffline(
        title="cronwheel",
        version=package_version(),
        description=_DESCRIPTION,
        openapi_tags=_TAGS,
        # Nothing leaves the page: no call to the public validator either.
        swagger_ui_parameters={"validatorUrl": None},
        lifespan=lifespan,
    )
    app.state.api = state
    app.state.settings = settings
    app.state.store = store
    app.state.logs = log_store or default_log_store(settings, store)
    app.state.key_cache = state.key_cache

    install_error_handlers(app)
    # Room for a full payload plus the rest of a job, or a batch of worker reports.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max(1 << 20, 4 * settings.max_payload_bytes))
    # Before the body is read, after the head is judged.
    app.add_middleware(
        RateLimitMiddleware,
        settings=settings,
        key_cache=state.key_cache,
        shared=state.key_rates,
    )
    app.add_middleware(HeadLimitMiddleware, limits=HeadLimits.of(settings))
    app.add_middleware(MetricsMiddleware)  # added last: outermost, so it sees every answer

    # A request's route is found by trying each router in turn: the hottest first.
    routers: list[APIRouter] = [
        m.router
        for m in (
            jobs,
            job_edit,
            tenants,
            runs,
            alerts,
            workers,
            attempts,
            pools,
            overview,
            logs,
            audit,
            bulk,
            overrides,
            workflows,
            health,
        )
    ]
    routers += [runs.dead_letters, workflows.runs_router]
    for router in routers:
        app.include_router(router)
    # The dashboard (/ui), after the API: its catch-all answers only under /ui.
    from cronwheel.ui import mount_ui

    routers += mount_ui(app)
    # The routers' routes carry their full paths; the app's own are the schema and docs.
    app.state.allowed_methods = AllowedMethods(
        [r for router in routers for r in router.routes if isinstance(r, Route)]
        + [r for r in app.router.routes if isinstance(r, Route)]
    )
    return app
