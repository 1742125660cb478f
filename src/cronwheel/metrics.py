"""Prometheus metrics: every collector cronwheel defines, in one registry.

The API and the scheduler both record into these; the API's HTTP side (request
counting, the ``/metrics`` endpoints and their auth) is ``cronwheel.api.metrics``.
Every metric lives in :data:`REGISTRY`, a dedicated registry rather than the process
default, so that creating several apps (tests, an embedded server) never registers a
metric twice and nothing foreign leaks into ``/metrics``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from cronwheel.domain.pools import priority_class

__all__ = [
    "API_RATE_LIMITED",
    "API_REQUESTS",
    "API_REQUEST_DURATION",
    "CLOCK_OFFSET",
    "CLOCK_UNCERTAINTY",
    "CONTENT_TYPE_LATEST",
    "DEAD_LETTERS",
    "DISPATCH_LATENESS",
    "DURATION_BUCKETS",
    "EXECUTION_DURATION",
    "LATENESS_BUCKETS",
    "LEASE_EXPIRIES",
    "LIVE_WORKERS",
    "OTHER_TASKS",
    "POOL_CAPACITY",
    "POOL_FREE_SLOTS",
    "QUARANTINED_RUNS",
    "READY_BACKLOG",
    "READY_QUEUE",
    "REGISTRY",
    "RETRIES",
    "RUNS_BY_STATE",
    "RUNS_MISSED",
    "RUNS_QUARANTINED",
    "RUNS_THROTTLED",
    "SCHEDULES_STALLED",
    "SHARDS_HELD",
    "SHARD_OWNERS",
    "SHARD_OWNERSHIP",
    "START_LATENESS",
    "TASK_LABELS",
    "TENANT_NAMES",
    "UNROUTABLE_RUNS",
    "WEBHOOK_TASK",
    "TaskLabels",
    "TenantNames",
    "observe_dispatch_lateness",
    "observe_execution",
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
    "Time from a run's fire instant to its dispatch (observed by the scheduler), by "
    "tenant name and priority class P0..P3.",
    ["tenant", "priority"],
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
    "Time from a run's due instant to a worker leasing its first attempt, by tenant name "
    "and priority class P0..P3.",
    ["tenant", "priority"],
    buckets=LATENESS_BUCKETS,
    registry=REGISTRY,
)
# 10 ms … 6 h: handlers run from milliseconds to hours.
DURATION_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    21600.0,
)
EXECUTION_DURATION = Histogram(
    "cronwheel_execution_duration_seconds",
    "How long attempts ran, from their start to their worker's report of success or "
    "failure, by tenant name, task (the first task_label_max distinct names this "
    "process saw; every other one as 'other'; 'webhook' for webhook runs) and outcome "
    "(succeeded, failed).",
    ["tenant", "task", "outcome"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
LEASE_EXPIRIES = Counter(
    "cronwheel_lease_expiries",
    "Attempts the expiry sweep ended, by reason: lost (the worker stopped "
    "heartbeating), timed_out (past the job's timeout or progress timeout).",
    ["reason"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "cronwheel_retries",
    "Failed tries scheduled to run again (a worker's failure, a lost or timed-out "
    "attempt), by tenant name.",
    ["tenant"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "cronwheel_dead_letters",
    "Runs that ended DEAD_LETTER (out of tries, not retryable, or quarantined), by tenant name.",
    ["tenant"],
    registry=REGISTRY,
)
LIVE_WORKERS = Gauge(
    "cronwheel_workers_live",
    "Workers not deregistered and seen within worker_ttl, by pool (as "
    "cronwheel_pool_capacity; refreshed at scrape time).",
    ["pool"],
    registry=REGISTRY,
)
SHARD_OWNERSHIP = Gauge(
    "cronwheel_shards",
    "Shards by state: owned (a node holds an unexpired lease on it) or orphaned (none "
    "does: nothing fires its runs until a node takes it); refreshed at scrape time.",
    ["state"],
    registry=REGISTRY,
)
SHARD_OWNERS = Gauge(
    "cronwheel_shard_owners",
    "Scheduler nodes holding an unexpired lease on at least one shard (refreshed at scrape time).",
    registry=REGISTRY,
)
READY_QUEUE = Gauge(
    "cronwheel_ready_queue",
    "Runs in the ready queue (dispatched, waiting for a worker to lease them), by pool "
    "as cronwheel_pool_capacity (refreshed at scrape time).",
    ["pool"],
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
RUNS_MISSED = Counter(
    "cronwheel_runs_missed",
    "Runs found undispatched past their fire time plus their job's lateness budget "
    "(once per run and stint: the run.missed event), by tenant name.",
    ["tenant"],
    registry=REGISTRY,
)
SCHEDULES_STALLED = Counter(
    "cronwheel_schedules_stalled",
    "Recurring jobs found with no run to fire an occurrence already past their lateness "
    "budget (the job.schedule_stalled event).",
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


OTHER_TASKS = "other"
WEBHOOK_TASK = "webhook"


class TaskLabels:
    """The task label of an execution: a task name is the tenant's to choose, so only
    the first ``limit`` distinct names a process sees get a series of their own; every
    later one counts as :data:`OTHER_TASKS`."""

    def __init__(self, limit: int = 50) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def label(self, task: str | None) -> str:
        if task is None:
            return WEBHOOK_TASK
        if task in self._seen:
            return task
        if len(self._seen) < self.limit:
            self._seen.add(task)
            return task
        return OTHER_TASKS


TASK_LABELS = TaskLabels()

_Lookup = Callable[[list[uuid.UUID]], Awaitable[dict[uuid.UUID, str]]]


class TenantNames:
    """Tenant id → name for the ``tenant`` label (an admin creates tenants, so the set
    is bounded). A name is read from the store once, when its id is first seen; the
    ids are kept at most ``limit`` (then the cache starts over)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._names: dict[uuid.UUID, str] = {}

    async def names(self, ids: Iterable[uuid.UUID], lookup: _Lookup) -> dict[uuid.UUID, str]:
        wanted = set(ids)
        missing = sorted(wanted - self._names.keys())
        if missing:
            if len(self._names) + len(missing) > self.limit:
                self._names.clear()
            found = await lookup(missing)
            self._names.update({i: found.get(i, "deleted") for i in missing})
        return {i: self._names[i] for i in wanted}


TENANT_NAMES = TenantNames()


def observe_start_lateness(starts: Iterable[tuple[datetime, datetime, str, int]]) -> None:
    """Each ``(due_at, started_at, tenant name, priority)`` of runs begun: the labels
    are looked up once per tenant and class, however many runs a lease answer holds."""
    children: dict[tuple[str, int], Histogram] = {}
    for due_at, started_at, tenant, priority in starts:
        child = children.get((tenant, priority))
        if child is None:
            child = children[(tenant, priority)] = START_LATENESS.labels(
                tenant=tenant, priority=priority_class(priority)
            )
        child.observe(max(0.0, (started_at - due_at).total_seconds()))


def observe_dispatch_lateness(
    *, fire_at: datetime, dispatched_at: datetime, tenant: str, priority: int
) -> None:
    DISPATCH_LATENESS.labels(tenant=tenant, priority=priority_class(priority)).observe(
        max(0.0, (dispatched_at - fire_at).total_seconds())
    )


def observe_execution(*, tenant: str, task: str | None, outcome: str, seconds: float) -> None:
    EXECUTION_DURATION.labels(tenant=tenant, task=TASK_LABELS.label(task), outcome=outcome).observe(
        max(0.0, seconds)
    )


def render() -> bytes:
    return generate_latest(REGISTRY)
