"""Prometheus metrics shared by the API and the scheduler.

Every metric lives in :data:`REGISTRY`, a dedicated registry rather than the process
default, so that creating several apps (tests, an embedded server) never registers a
metric twice and nothing foreign leaks into ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cronwheel.api.auth import bearer_token, may_read_metrics
from cronwheel.api.errors import error_response
from cronwheel.domain.states import RunState
from cronwheel.settings import OTHER_POOLS, Settings
from cronwheel.store.base import Store

__all__ = [
    "API_REQUESTS",
    "API_REQUEST_DURATION",
    "CLOCK_OFFSET",
    "CLOCK_UNCERTAINTY",
    "CONTENT_TYPE_LATEST",
    "DISPATCH_LATENESS",
    "LATENESS_BUCKETS",
    "QUARANTINED_RUNS",
    "REGISTRY",
    "RUNS_BY_STATE",
    "RUNS_QUARANTINED",
    "SHARDS_HELD",
    "START_LATENESS",
    "UNROUTABLE_RUNS",
    "MetricsApp",
    "MetricsMiddleware",
    "RunsByStateRefresher",
    "observe_start_lateness",
    "render",
]

REGISTRY = CollectorRegistry(auto_describe=True)

# 1 ms … 60 s: the dispatch target is 500 ms, so the resolution is finest below it.
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

DISPATCH_LATENESS = Histogram(
    "cronwheel_dispatch_lateness_seconds",
    "Time from a run's fire instant to its dispatch (observed by the scheduler).",
    buckets=LATENESS_BUCKETS,
    registry=REGISTRY,
)
CLOCK_OFFSET = Gauge(
    "cronwheel_scheduler_clock_offset_seconds",
    "The database clock minus this scheduler node's local clock, as last measured.",
    registry=REGISTRY,
)
CLOCK_UNCERTAINTY = Gauge(
    "cronwheel_scheduler_clock_uncertainty_seconds",
    "How far this node's corrected time may be off: the larger of the last measurement's "
    "round trip and the offset's change since the one before (drift).",
    registry=REGISTRY,
)
SHARDS_HELD = Gauge(
    "cronwheel_scheduler_shards_held",
    "Shards this scheduler node holds a lease on.",
    registry=REGISTRY,
)
START_LATENESS = Histogram(
    "cronwheel_start_lateness_seconds",
    "Time from a run's due instant to a worker leasing its first attempt.",
    buckets=LATENESS_BUCKETS,
    registry=REGISTRY,
)
RUNS_BY_STATE = Gauge(
    "cronwheel_runs",
    "Runs in the store by state (refreshed at scrape time).",
    ["state"],
    registry=REGISTRY,
)
UNROUTABLE_RUNS = Gauge(
    "cronwheel_runs_unroutable",
    "Dispatched runs no live worker can take, by pool: the pools of the setting "
    "metrics_pools, every other one as 'other' (refreshed at scrape time).",
    ["pool"],
    registry=REGISTRY,
)
RUNS_QUARANTINED = Counter(
    "cronwheel_scheduler_runs_quarantined",
    "Runs this scheduler node took out of a pass because a step failed on them alone "
    "(poison rows), by step: fire, expire.",
    ["step"],
    registry=REGISTRY,
)
QUARANTINED_RUNS = Gauge(
    "cronwheel_runs_quarantined",
    "Quarantined runs not redriven, of jobs not cancelled (refreshed at scrape time).",
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "cronwheel_api_requests",
    "API requests by route template, method and status.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
API_REQUEST_DURATION = Histogram(
    "cronwheel_api_request_duration_seconds",
    "API request duration by route template (long-polls included).",
    ["route"],
    buckets=LATENESS_BUCKETS,
    registry=REGISTRY,
)


def observe_start_lateness(*, due_at: datetime, started_at: datetime) -> None:
    START_LATENESS.observe(max(0.0, (started_at - due_at).total_seconds()))


class RunsByStateRefresher:
    """The gauges read from the runs table — runs by state, unroutable runs by pool.
    Counting scans a large table: at most one refresh per ``max_age`` seconds, however
    often Prometheus (or several of them) scrape.

    Pool names are the tenants' to choose: as label values they would show one tenant's
    names to whoever reads the metrics and let a tenant create series without bound. So
    only the operator's ``pools`` get a value of their own; every other pool counts
    under :data:`OTHER_POOLS`. The label set is fixed, and every value is set at each
    refresh (0 when none waits)."""

    def __init__(
        self, store: Store, *, pools: Iterable[str] = ("default",), max_age: float = 5.0
    ) -> None:
        self._store = store
        self.max_age = max_age
        self._refreshed_at: float | None = None
        self._pools = frozenset(pools) - {OTHER_POOLS}

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
        self._refreshed_at = now


def render() -> bytes:
    return generate_latest(REGISTRY)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class MetricsMiddleware:
    """Counts every HTTP request by its route *template* (``/v1/jobs/{job_id}``), never
    by its raw path, so label cardinality stays bounded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
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
