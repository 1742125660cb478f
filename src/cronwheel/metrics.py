"""Prometheus metrics: every collector cronwheel defines, in one registry.

The API and the scheduler both record into these; the API's HTTP side (request
counting, the ``/metrics`` endpoints and their auth) is ``cronwheel.api.metrics``.
Every metric lives in :data:`REGISTRY`, a dedicated registry rather than the process
default, so that creating several apps (tests, an embedded server) never registers a
metric twice and nothing foreign leaks into ``/metrics``.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

__all__ = [
    "API_RATE_LIMITED",
    "API_REQUESTS",
    "API_REQUEST_DURATION",
    "CLOCK_OFFSET",
    "CLOCK_UNCERTAINTY",
    "CONTENT_TYPE_LATEST",
    "DISPATCH_LATENESS",
    "LATENESS_BUCKETS",
    "POOL_CAPACITY",
    "POOL_FREE_SLOTS",
    "QUARANTINED_RUNS",
    "READY_BACKLOG",
    "REGISTRY",
    "RUNS_BY_STATE",
    "RUNS_QUARANTINED",
    "RUNS_THROTTLED",
    "SHARDS_HELD",
    "START_LATENESS",
    "UNROUTABLE_RUNS",
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
POOL_CAPACITY = Gauge(
    "cronwheel_pool_capacity",
    "Slots of the pool's live workers, by pool: the pools of the setting metrics_pools, "
    "every other one as 'other' (refreshed at scrape time).",
    ["pool"],
    registry=REGISTRY,
)
POOL_FREE_SLOTS = Gauge(
    "cronwheel_pool_free_slots",
    "Slots of the pool's live workers that no running attempt or reservation holds, by "
    "pool as cronwheel_pool_capacity (refreshed at scrape time).",
    ["pool"],
    registry=REGISTRY,
)
READY_BACKLOG = Gauge(
    "cronwheel_ready_backlog",
    "Runs waiting for a worker — in the ready queue, or due and not dispatched yet — by "
    "pool (as cronwheel_pool_capacity), tenant name and priority class P0..P3 "
    "(refreshed at scrape time).",
    ["pool", "tenant", "priority"],
    registry=REGISTRY,
)
RUNS_THROTTLED = Counter(
    "cronwheel_runs_throttled",
    "Times a tenant's waiting runs were held back by one of its limits, by tenant name "
    "and limit: at a lease, max_concurrent_runs or max_dispatch_rate (once per lease "
    "that held it); at creation, max_pending_runs (once per refused request).",
    ["tenant", "limit"],
    registry=REGISTRY,
)
API_RATE_LIMITED = Counter(
    "cronwheel_api_rate_limited",
    "API requests refused with 429 rate_limited, by the tenant id of the key ('none': "
    "requests without a tenant's key).",
    ["tenant"],
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


def render() -> bytes:
    return generate_latest(REGISTRY)
