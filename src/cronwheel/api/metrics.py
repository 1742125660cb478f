"""The API's side of the metrics (the collectors themselves are ``cronwheel.metrics``):
the gauges refreshed from the store at scrape time, request counting, and ``/metrics``
for a process without the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cronwheel.api.auth import REQUEST_ID_HEADER, bearer_token, may_read_metrics, request_id_of
from cronwheel.api.errors import error_response
from cronwheel.domain.pools import priority_class
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.domain.states import RunState
from cronwheel.metrics import (
    API_REQUEST_DURATION,
    API_REQUESTS,
    CONTENT_TYPE_LATEST,
    LIVE_WORKERS,
    POOL_CAPACITY,
    POOL_FREE_SLOTS,
    QUARANTINED_RUNS,
    READY_BACKLOG,
    READY_QUEUE,
    RUNS_BY_STATE,
    SHARD_OWNERS,
    SHARD_OWNERSHIP,
    UNROUTABLE_RUNS,
    render,
)
from cronwheel.settings import OTHER_POOLS, Settings
from cronwheel.store.base import Store

__all__ = ["MetricsApp", "MetricsMiddleware", "RunsByStateRefresher"]


class RunsByStateRefresher:
    """The gauges read from the runs table — runs by state, unroutable runs by pool,
    each pool's capacity, free slots and backlog (``pools_status``).
    Counting scans a large table: at most one refresh per ``max_age`` seconds, however
    often Prometheus (or several of them) scrape.

    Pool names are the tenants' to choose: as label values they would show one tenant's
    names to whoever reads the metrics and let a tenant create series without bound. So
    only the operator's ``pools`` get a value of their own; every other pool counts
    under :data:`OTHER_POOLS`. The label set is fixed, and every value is set at each
    refresh (0 when none waits). The backlog's other labels are bounded too: tenants
    (an admin creates them) and the four priority classes; a series whose runs are all
    gone is removed."""

    def __init__(
        self,
        store: Store,
        *,
        pools: Iterable[str] = ("default",),
        max_age: float = 5.0,
        p0_reserved_share: float = 0.0,
        worker_ttl: float = 30.0,
    ) -> None:
        self._store = store
        self.max_age = max_age
        self._refreshed_at: float | None = None
        self._pools = frozenset(pools) - {OTHER_POOLS}
        self._share = p0_reserved_share
        self._worker_ttl = worker_ttl

    async def refresh(self) -> None:
        now = time.monotonic()
        if self._refreshed_at is not None and now - self._refreshed_at < self.max_age:
            return
        counts = await self._store.runs_count_by_state()
        for state in RunState:
            RUNS_BY_STATE.labels(state=state.value).set(counts.get(state.value, 0))
        by_label = dict.fromkeys([*self._pools, OTHER_POOLS], 0)
        for group in await self._store.runs_unroutable(None):
            label = group.pool if group.pool in self._pools else OTHER_POOLS
            by_label[label] += group.runs
        for label, count in by_label.items():
            UNROUTABLE_RUNS.labels(pool=label).set(count)
        QUARANTINED_RUNS.set(await self._store.runs_count_quarantined())
        await self._refresh_pools()
        await self._refresh_shards()
        self._refreshed_at = now

    async def _refresh_shards(self) -> None:
        at = await self._store.db_now()
        leases = await self._store.shard_leases_list()
        held = [
            lease
            for lease in leases
            if lease["owner"] is not None
            and lease["expires_at"] is not None
            and lease["expires_at"] > at
        ]
        SHARD_OWNERSHIP.labels(state="owned").set(len(held))
        SHARD_OWNERSHIP.labels(state="orphaned").set(NUM_SHARDS - len(held))
        SHARD_OWNERS.set(len({lease["owner"] for lease in held}))

    def _label(self, pool: str) -> str:
        return pool if pool in self._pools else OTHER_POOLS

    async def _refresh_pools(self) -> None:
        statuses = await self._store.pools_status(
            None, default_share=self._share, worker_ttl=self._worker_ttl
        )
        capacity = dict.fromkeys([*self._pools, OTHER_POOLS], 0)
        free = dict(capacity)
        workers = dict(capacity)
        ready = dict(capacity)
        backlog: dict[tuple[str, str, str], int] = {}
        for status in statuses:
            label = self._label(status.name)
            capacity[label] += status.capacity
            free[label] += status.free or 0
            workers[label] += status.workers
            ready[label] += status.ready
            for b in status.backlog:
                key = (label, b.tenant_name, priority_class(b.priority))
                backlog[key] = backlog.get(key, 0) + b.total
        for label, value in capacity.items():
            POOL_CAPACITY.labels(pool=label).set(value)
            POOL_FREE_SLOTS.labels(pool=label).set(free[label])
            LIVE_WORKERS.labels(pool=label).set(workers[label])
            READY_QUEUE.labels(pool=label).set(ready[label])
        READY_BACKLOG.clear()  # with no await before the new values are in
        for (pool, tenant, priority), value in backlog.items():
            READY_BACKLOG.labels(pool=pool, tenant=tenant, priority=priority).set(value)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class MetricsMiddleware:
    """Counts every HTTP request by its route *template* (``/v1/jobs/{job_id}``), never
    by its raw path, so label cardinality stays bounded. Every answer says how long the
    server took to start it, in ``Server-Timing: app;dur=<ms>``, and carries the
    request's id (``X-Request-Id``, the one the audit trail records): a request whose
    own id is unusable is answered 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()
        request_id = request_id_of(scope)

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                took = f"app;dur={(time.perf_counter() - started) * 1000:.3f}"
                headers = [*message.get("headers", ()), (b"server-timing", took.encode())]
                if request_id is not None:
                    headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        app = self.app
        if request_id is None:
            app = error_response(
                400,
                "invalid_request_id",
                f"{REQUEST_ID_HEADER} must be 1 to 200 printable ASCII characters",
                field=REQUEST_ID_HEADER,
            )
        try:
            await app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in _METHODS else "OTHER"
            API_REQUESTS.labels(route=template, method=method, status=str(status)).inc()
            API_REQUEST_DURATION.labels(route=template).observe(time.perf_counter() - started)


class MetricsApp:
    """``GET /metrics`` and nothing else, for a process without the API (``cronwheel
    scheduler --metrics-port``): the same rule as the API's route — the metrics token or
    the admin key — and the same JSON errors."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        response: Response
        if scope["path"] != "/metrics":
            response = error_response(404, "not_found", f"no such endpoint: {scope['path']}")
        elif scope["method"] not in ("GET", "HEAD"):
            response = error_response(
                405, "method_not_allowed", f"method {scope['method']} is not allowed"
            )
        elif not self._allowed(scope):
            response = error_response(
                401,
                "unauthorized",
                "send 'Authorization: Bearer <metrics token or admin key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        else:
            response = Response(render(), media_type=CONTENT_TYPE_LATEST)
        await response(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        key = bearer_token(scope["headers"])
        return key is not None and may_read_metrics(key, self.settings)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
