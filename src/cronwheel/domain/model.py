"""Records the store hands back. Plain frozen dataclasses: no I/O, no validation —
what reaches them has already been validated (``spec.py``) or read from the store."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from cronwheel.domain.audit import Actor
from cronwheel.domain.states import AttemptState, JobState, RunState
from cronwheel.domain.template import RunTemplate

__all__ = [
    "ROLES",
    "ApiKey",
    "Attempt",
    "AttemptOutcome",
    "CancelRequest",
    "DueRun",
    "Event",
    "FiredRun",
    "Job",
    "LeasedAttempt",
    "MissedRun",
    "NewJob",
    "Page",
    "QuarantinedRun",
    "ReservationsStarted",
    "Role",
    "RouteCheck",
    "Run",
    "ScheduleProbe",
    "SkippedOccurrence",
    "StalledJob",
    "Tenant",
    "UnroutableRuns",
    "Worker",
    "WorkerStatus",
]

T = TypeVar("T")

Role = str  # "admin" | "operator" | "viewer" | "worker"
ROLES: tuple[str, ...] = ("admin", "operator", "viewer", "worker")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Tenant:
    id: uuid.UUID
    name: str
    limits: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: uuid.UUID
    tenant_id: uuid.UUID | None  # None: an admin key, or a worker key shared by all tenants
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SkippedOccurrence:
    """An occurrence recorded SKIPPED rather than run (a wall time a DST gap removes
    under ``on_nonexistent="skip"``), filed at ``due_at``."""

    due_at: datetime
    due_local: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to create: the validated spec plus what the API resolved for it."""

    spec: Any  # cronwheel.domain.spec.JobSpec
    first_due_at: datetime | None  # None: nothing to materialise yet
    idempotency_key: str | None = None
    actor: Actor | None = None  # who creates it (``domain/audit.py``)
    due_local: str | None = None
    # Occurrences between the job's creation and its first run that do not run: recorded
    # SKIPPED with the job, so none is lost silently.
    skipped: tuple[SkippedOccurrence, ...] = ()
    # A workflow's DAG (``domain/workflow.Dag``'s JSON): the job is that workflow.
    workflow: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Job:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    state: JobState
    kind: str  # at | delay | asap | cron | interval
    schedule: dict[str, Any]
    template: RunTemplate  # what each of its runs is made from
    version: int
    next_due_at: datetime | None
    created_at: datetime
    updated_at: datetime
    idempotency_key: str | None = None
    # Its ``future`` overrides as a new run takes them (``jobs.overrides``); None: none.
    overlay: dict[str, Any] | None = None
    # A workflow's DAG (``domain/workflow.Dag``'s JSON); None for a job.
    workflow: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Run:
    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    shard: int
    state: RunState
    due_at: datetime
    due_local: str | None
    fire_at: datetime
    priority: int
    pool: str
    requires: list[str]
    tags: list[str]
    task: str | None
    webhook: dict[str, Any] | None
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    retry: dict[str, Any]
    timeout: float
    heartbeat_timeout: float
    reason: str | None
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    result: Any = None
    last_error: str | None = None
    job_name: str | None = None
    origin: str = "once"  # once | schedule | trigger | backfill | replay
    wait_reason: str | None = None  # why a DISPATCHED run waits: no live worker can take it
    progress_timeout: float | None = None  # seconds the handler may go without a report
    # When a step of a scheduler pass failed on this run alone and took it out of the
    # pass (a DEAD_LETTER with the error as its reason); None once redriven.
    quarantined_at: datetime | None = None
    # Only a worker whose tags include every one of these leases the run.
    route_tags: list[str] = field(default_factory=list)
    # The overrides that made its payload, timeout, priority and pool what they are, in
    # the merge order (``domain/overrides.py``), and what those were before them.
    override_ids: list[uuid.UUID] = field(default_factory=list)
    base: dict[str, Any] | None = None
    # A workflow's node run: its workflow run and node (``domain/workflow.py``).
    workflow_run_id: uuid.UUID | None = None
    node: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    id: uuid.UUID
    tenant_id: uuid.UUID
    run_id: uuid.UUID
    number: int
    worker_id: uuid.UUID | None
    fencing_token: int
    state: AttemptState
    lease_expires_at: datetime
    deadline: datetime
    started_at: datetime
    heartbeat_at: datetime | None
    finished_at: datetime | None
    error: str | None
    result: Any = None
    # Under a progress timeout: past this instant (pushed by each report) it times out.
    progress_deadline: datetime | None = None
    progress_at: datetime | None = None  # when the handler last reported progress
    progress_details: Any = None  # the details of that report
    worker_name: str | None = None  # its worker's name, where read with it (history)


@dataclass(frozen=True, slots=True)
class LeasedAttempt:
    """What a worker receives for each run it leases."""

    attempt_id: uuid.UUID
    run_id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    number: int
    task: str | None
    webhook: dict[str, Any] | None
    payload: dict[str, Any]
    fencing_token: int
    lease_expires_at: datetime
    deadline: datetime
    due_at: datetime
    heartbeat_timeout: float
    # Set on a reservation (a run leased ahead of its instant): the attempt has not
    # started; the worker starts it by confirming at this instant or later, and until
    # then ``lease_expires_at`` is when the reservation lapses and ``deadline`` what the
    # deadline would be if it started exactly at ``not_before``.
    not_before: datetime | None = None
    # The run's progress timeout: the handler reports progress within it, or the
    # attempt times out.
    progress_timeout: float | None = None
    # The run's priority class (0 = P0, the highest): a worker that holds leased runs
    # waiting for a slot starts the highest class first.
    priority: int = 2
    # A workflow's node run: its workflow run (its outcome moves the workflow on).
    workflow_run_id: uuid.UUID | None = None
    # A gated reservation: a node whose upstream nodes are still under way, reserved
    # ahead of its gate (``not_before`` is None). Its holder begins it when the gate
    # opens, with the payload the opening gives it, and then starts it.
    # ``lease_expires_at`` is when the reservation lapses, ``deadline`` what the
    # deadline would be if it began at the lease.
    gated: bool = False


@dataclass(frozen=True, slots=True)
class ReservationsStarted:
    """The store's answer to starting reservations, by fencing token. ``started_at`` is
    when the start was made; a run started ahead of its instant (``fire_at``) begins at
    that instant instead: its attempt's lease runs to its beginning plus its heartbeat
    timeout, its deadline to its beginning plus its timeout."""

    started_at: datetime | None  # None when nothing started
    started: list[int] = field(default_factory=list)
    not_yet: list[int] = field(default_factory=list)  # due later: nothing changed
    refused: list[int] = field(default_factory=list)  # the reservation is gone
    # (due instant, beginning, tenant, priority) of the started runs' first tries
    # (start lateness).
    first_tries: list[tuple[datetime, datetime, uuid.UUID, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """The store's answer for one item of a heartbeat/complete/fail batch."""

    attempt_id: uuid.UUID
    ok: bool
    error_code: str | None = None  # "stale_fencing_token" | "not_found" when not ok
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    run_state: RunState | None = None
    # Of an attempt its worker ended (for the execution duration metric): the run's
    # tenant and task, and how long the attempt ran.
    tenant_id: uuid.UUID | None = None
    task: str | None = None
    ran: float | None = None
    # Of a workflow's node run ended by the attempt: its workflow run, to advance.
    workflow_run_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A live attempt whose run a user (or ``overlap: cancel_previous``) asked to stop."""

    attempt_id: uuid.UUID
    run_id: uuid.UUID
    fencing_token: int


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    tenant_id: uuid.UUID | None
    at: datetime
    kind: str  # "run.transition", "job.created", "job.cancelled", "tenant.created", …
    job_id: uuid.UUID | None
    run_id: uuid.UUID | None
    attempt_id: uuid.UUID | None
    from_state: str | None
    to_state: str | None
    actor: str | None
    reason: str | None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Worker:
    id: uuid.UUID
    tenant_id: uuid.UUID | None  # None: serves every tenant's runs in its pool
    pool: str
    capabilities: list[str]
    tags: list[str]
    capacity: int
    registered_at: datetime
    last_seen_at: datetime
    name: str | None = None
    deregistered_at: datetime | None = None
    webhooks_only: bool = False  # calls webhooks, runs no task handlers
    # The task names it runs: it leases runs of these tasks only (and webhook runs, as
    # its capabilities allow). None: any task (a worker that declared none).
    tasks: list[str] | None = None


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker as listed: its record and what it holds now."""

    worker: Worker
    running: int  # attempts it holds (RUNNING), each taking one of its slots
    reserved: int  # runs reserved for it, leased ahead and not started yet
    live: bool  # counts for routing: not deregistered, seen lately or holding a lease


@dataclass(frozen=True, slots=True)
class DueRun:
    """An entry of a scheduler's in-memory due window."""

    id: uuid.UUID
    shard: int
    fire_at: datetime


@dataclass(frozen=True, slots=True)
class FiredRun:
    id: uuid.UUID
    tenant_id: uuid.UUID
    pool: str
    fire_at: datetime
    dispatched_at: datetime
    priority: int = 2  # for the dispatch lateness metric's label


@dataclass(frozen=True, slots=True)
class UnroutableRuns:
    """DISPATCHED runs of one tenant, pool, set of required capabilities and of route
    tags that wait, for one reason, because no live worker can take them."""

    tenant_id: uuid.UUID
    pool: str
    requires: list[str]
    reason: str
    runs: int
    since: datetime  # when the longest-waiting of them was dispatched
    route_tags: list[str] = field(default_factory=list)  # the tags a worker must carry


@dataclass(frozen=True, slots=True)
class RouteCheck:
    """What one routing check did."""

    waiting: int  # runs now waiting with a reason
    marked: int  # runs that started waiting for a (new) reason
    cleared: int  # runs whose reason was cleared


@dataclass(frozen=True, slots=True)
class QuarantinedRun:
    """A run a step of a scheduler pass failed on alone, taken out of the pass as a
    DEAD_LETTER until it is redriven or its job cancelled."""

    run_id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    job_name: str
    pool: str
    quarantined_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class MissedRun:
    """A run still undispatched past its fire time plus its job's lateness budget."""

    run_id: uuid.UUID
    tenant_id: uuid.UUID
    tenant_name: str
    job_id: uuid.UUID
    job_name: str
    pool: str
    priority: int
    fire_at: datetime
    missed_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleProbe:
    """What the stalled-schedule check reads of a recurring job: its schedule and
    budget, and its latest scheduled run (None: it has none)."""

    job_id: uuid.UUID
    tenant_id: uuid.UUID
    state: str
    kind: str
    schedule: dict[str, Any]
    lateness_budget: float | None
    spread: float
    created_at: datetime
    stalled_at: datetime | None
    latest_due_at: datetime | None
    latest_state: str | None


@dataclass(frozen=True, slots=True)
class StalledJob:
    """An active recurring job whose next occurrence is past its lateness budget with
    no run to fire it."""

    job_id: uuid.UUID
    tenant_id: uuid.UUID
    tenant_name: str
    job_name: str
    pool: str
    stalled_at: datetime
