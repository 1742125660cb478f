"""Request and response bodies of the REST API (the job itself is
:class:`cronwheel.domain.spec.JobSpec`).

Requests forbid unknown fields so a typo is an error. Every instant in a response is
UTC with ``Z``; where a time zone applies the local form with its offset sits beside it.
"""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from cronwheel.api.redaction import WEBHOOK_OUT_DESCRIPTION
from cronwheel.domain.bounds import (
    BACKFILL_RATE_MAX,
    BACKFILL_RATE_MIN,
    Flag,
    Instant,
    Integer,
    Seconds,
)
from cronwheel.domain.spec import JobSpec, TenantLimits, parse_schedule
from cronwheel.store.values import REDRIVE_BATCH_MAX

__all__ = [
    "ADDS_RUNS",
    "ERROR_RESPONSES",
    "AlertList",
    "AlertOut",
    "AttemptOut",
    "BackfillOut",
    "BackfillRequest",
    "CancelRequest",
    "DeadLetterRedriveOut",
    "DeadLetterRedriveRequest",
    "ErrorDetail",
    "ErrorResponse",
    "EventList",
    "EventOut",
    "FencingToken",
    "IndexOut",
    "JobControlRequest",
    "JobDeletedOut",
    "JobList",
    "JobOut",
    "JobPatch",
    "JobPatchBase",
    "KeyCreate",
    "KeyCreated",
    "KeyList",
    "KeyOut",
    "PreviewItem",
    "PreviewOut",
    "RequestModel",
    "ResponseModel",
    "RunDetail",
    "RunList",
    "RunOut",
    "SkippedRun",
    "StoppedRun",
    "TenantCreate",
    "TenantCreated",
    "TenantDeletedOut",
    "TenantList",
    "TenantOut",
    "TenantUpdate",
    "TriggerRequest",
    "UtcInstant",
    "UtcRequestInstant",
    "WebhookSecretOut",
]


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcInstant = Annotated[datetime, AfterValidator(_to_utc)]
# An instant a client sends, within the bounds every backend holds, kept in UTC.
UtcRequestInstant = Annotated[Instant, AfterValidator(_to_utc)]


class RequestModel(BaseModel):
    """A request body: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    """A response body."""

    model_config = ConfigDict(frozen=True)


# -- errors ----------------------------------------------------------------------------


class ErrorDetail(ResponseModel):
    code: str = Field(description="stable machine-readable code, e.g. `invalid_schedule`")
    message: str = Field(description="what went wrong, for people")
    field: str | None = Field(default=None, description="dotted path of the offending field")
    details: dict[str, Any] | None = None


class ErrorResponse(ResponseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Malformed request (bad JSON, no tenant)"},
    401: {"model": ErrorResponse, "description": "Missing or invalid API key"},
    403: {"model": ErrorResponse, "description": "The key's role does not allow this"},
    404: {"model": ErrorResponse, "description": "Unknown id, or another tenant's"},
    413: {"model": ErrorResponse, "description": "Request body or payload too large"},
    422: {"model": ErrorResponse, "description": "Invalid input; `field` names it"},
    429: {
        "model": ErrorResponse,
        "description": "Too many requests with this key (`rate_limited`): retry after "
        "`Retry-After` seconds",
    },
}

# The routes that add runs on request, over ERROR_RESPONSES' 429.
ADDS_RUNS: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorResponse,
        "description": "Too many requests with this key (`rate_limited`, retry after "
        "`Retry-After` seconds); or the runs this adds would take the tenant past its "
        "`max_pending_runs` (`limit_exceeded`; `details` names the limit, the tenant's "
        "pending runs and the limit) and nothing was stored",
    }
}


class IndexOut(ResponseModel):
    """What `GET /` answers: the server, and where to go from here."""

    name: str
    version: str
    links: dict[str, str] = Field(description="name → path on this server")


# -- tenants ---------------------------------------------------------------------------


class TenantCreate(RequestModel):
    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="unique; letters, digits, '.', '_' and '-'",
    )
    limits: TenantLimits | None = None


class TenantUpdate(RequestModel):
    limits: TenantLimits = Field(description="only the fields given change")


class TenantOut(ResponseModel):
    id: uuid.UUID
    name: str
    limits: dict[str, Any]
    created_at: UtcInstant


class TenantCreated(TenantOut):
    api_key: str = Field(description="an operator key for the tenant; shown only once")
    key_id: uuid.UUID
    key_prefix: str


class TenantList(ResponseModel):
    items: list[TenantOut]
    next_cursor: str | None


class WebhookSecretOut(ResponseModel):
    tenant_id: uuid.UUID
    webhook_secret: str = Field(
        description="the key of the HMAC-SHA256 in each webhook request's "
        "`Cronwheel-Signature` (see docs/webhooks.md)"
    )


class TenantDeletedOut(ResponseModel):
    """What deleting a tenant removed. The event `tenant.deleted` (who, when, why, these
    counts) and the tenant's other events not tied to a run remain: the audit trail."""

    id: uuid.UUID
    name: str
    deleted: Literal[True] = True
    deleted_at: UtcInstant
    jobs_deleted: int
    runs_deleted: int = Field(description="runs deleted with their attempts and events")
    runs_stopped: int = Field(description="runs that were in progress (force)")
    api_keys_deleted: int = Field(description="its keys: refused from now on")
    workers_deleted: int


class KeyCreate(RequestModel):
    role: Literal["operator", "viewer", "worker"]


class KeyCreated(ResponseModel):
    id: uuid.UUID
    tenant_id: uuid.UUID
    role: str
    prefix: str
    api_key: str = Field(description="the key; shown only once")
    created_at: UtcInstant


class KeyOut(ResponseModel):
    """A key as listed: never the key itself, nor its hash."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    role: str = Field(description="operator | viewer | worker")
    prefix: str = Field(description="the key's first characters, to recognise it by")
    created_at: UtcInstant
    revoked_at: UtcInstant | None = Field(
        description="when it was revoked (it authenticates nothing since); null: in use"
    )


class KeyList(ResponseModel):
    items: list[KeyOut]
    next_cursor: str | None


# -- jobs ------------------------------------------------------------------------------


class JobOut(ResponseModel):
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    state: str = Field(description="active | paused | cancelled | finished")
    schedule: dict[str, Any]
    task: str | None
    webhook: dict[str, Any] | None = Field(description=WEBHOOK_OUT_DESCRIPTION)
    payload: dict[str, Any]
    pool: str
    requires: list[str]
    tags: list[str] = Field(description="labels to find and filter by; they do not route")
    route_tags: list[str] = Field(
        default_factory=list,
        description="execution tags: only a worker whose tags include all of them leases "
        "the job's runs",
    )
    priority: int
    retry: dict[str, Any]
    timeout: float
    heartbeat_timeout: float
    progress_timeout: float | None = Field(
        default=None, description="seconds a handler may go without reporting progress"
    )
    spread: float = Field(
        default=0.0,
        description="seconds: each run fires at a deterministic offset in [0, spread) "
        "after its due instant (0: at its due instant)",
    )
    lateness_budget: float = Field(
        default=30.0,
        description="seconds a run may go undispatched past its fire time before it "
        "counts as missed (docs/alerts.md)",
    )
    next_due_at: UtcInstant | None
    version: int
    created_at: UtcInstant
    updated_at: UtcInstant
    idempotency_key: str | None = None
    first_run_id: uuid.UUID | None = Field(
        default=None, description="the run created with the job (in the answer to its creation)"
    )


class StoppedRun(ResponseModel):
    id: uuid.UUID
    state: str = Field(description="DISPATCHED or RUNNING: its state when the deletion ended it")


class JobDeletedOut(ResponseModel):
    """What deleting a job removed: the job, its runs, their attempts, events and worker
    logs. The event `job.deleted` (who, when, why) and the job's other events not tied
    to a run remain: the audit trail."""

    id: uuid.UUID
    name: str
    deleted: Literal[True] = True
    deleted_at: UtcInstant
    runs_deleted: int
    runs_stopped: list[StoppedRun] = Field(
        description="runs that were in progress, ended by the deletion (force=true): a "
        "worker's later report about one is refused as stale (409)"
    )


class JobList(ResponseModel):
    items: list[JobOut]
    next_cursor: str | None


class CancelRequest(RequestModel):
    reason: str | None = Field(default=None, max_length=1000)


class JobControlRequest(RequestModel):
    """The body of pause and resume (optional)."""

    reason: str | None = Field(
        default=None, max_length=1000, description="recorded in the job's history"
    )


class JobPatchBase(RequestModel):
    """A partial job: any of the fields a job is created with. Each field given replaces
    the job's whole (`schedule`, `payload`, `retry` and `webhook` included: nothing is
    merged inside them); `null` sets it back to its default. At least one field."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    reason: str | None = Field(
        default=None,
        max_length=1000,
        description="why: recorded in the job's history and the audit trail (not a field "
        "of the job; the `reason` query parameter says the same)",
    )


def _patch_schedule(value: Any) -> Any:
    # As a new job's: the schedule's model picked by its key, so errors name its fields.
    return None if value is None else parse_schedule(value)


def _job_patch() -> type[JobPatchBase]:
    """:class:`JobPatchBase` with every field of ``JobSpec``, each optional: the same
    types and bounds, validated field by field as a new job's are (the job they make is
    validated whole afterwards)."""
    fields: dict[str, Any] = {}
    for name, info in JobSpec.model_fields.items():
        optional = copy.copy(info)
        optional.default, optional.default_factory = None, None
        # The field's own bounds and checks apply to a value, never to null.
        value: Any = info.annotation
        if info.metadata:
            value = Annotated[(value, *info.metadata)]
            optional.metadata = []
        if name == "schedule":
            value = Annotated[value, BeforeValidator(_patch_schedule)]
        fields[name] = (Optional[value], optional)  # noqa: UP045 - a value, not a hint
    return create_model("JobPatch", __base__=JobPatchBase, **fields)


if TYPE_CHECKING:
    JobPatch = JobPatchBase
else:
    JobPatch = _job_patch()


class TriggerRequest(RequestModel):
    payload: dict[str, Any] | None = Field(
        default=None, description="merged over the job's payload for this run only"
    )


class BackfillRequest(RequestModel):
    start: Instant = Field(alias="from", description="the first instant of the range (inclusive)")
    end: Instant = Field(alias="to", description="the end of the range (exclusive); not after now")
    rate: Seconds = Field(
        default=10.0,
        ge=BACKFILL_RATE_MIN,
        le=BACKFILL_RATE_MAX,
        description="runs released per second, from now",
    )


class BackfillOut(ResponseModel):
    created: int = Field(description="runs created (occurrences that had one already get none)")
    runs: list[uuid.UUID] = Field(description="the ids of the runs created, oldest due first")


class PreviewItem(ResponseModel):
    due_at: UtcInstant
    fire_at: UtcInstant = Field(
        description="when the occurrence's run fires: due_at plus the job's spread offset "
        "(due_at itself for a job without spread)"
    )
    due_local: str = Field(
        description="the local wall time with its own offset (the UTC form where no "
        "time zone applies); a wall time skipped by a DST gap has no offset"
    )
    kind: str = Field(description="normal | ambiguous-first | ambiguous-second | shifted | skipped")
    reason: str | None = Field(default=None, description="why the occurrence is shifted or skipped")


class PreviewOut(ResponseModel):
    items: list[PreviewItem]


# -- runs ------------------------------------------------------------------------------


class RunOut(ResponseModel):
    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    job_name: str | None
    state: str = Field(description="SCHEDULED | DISPATCHED | RUNNING | SUCCESS | FAILED | …")
    origin: str = Field(
        description="once | schedule | trigger | backfill | replay | node: what made the run",
    )
    due_at: UtcInstant
    due_local: str | None = Field(description="the due instant with its local offset")
    fire_at: UtcInstant = Field(description="when the run is (or was) to be dispatched")
    created_at: UtcInstant
    dispatched_at: UtcInstant | None
    started_at: UtcInstant | None
    finished_at: UtcInstant | None
    dispatch_lateness_ms: float | None = Field(description="dispatched_at - fire_at")
    start_lateness_ms: float | None = Field(description="started_at - fire_at")
    priority: int
    pool: str
    requires: list[str]
    tags: list[str] = Field(description="labels to find and filter by; they do not route")
    route_tags: list[str] = Field(
        default_factory=list,
        description="execution tags: only a worker whose tags include all of them leases the run",
    )
    task: str | None
    webhook: dict[str, Any] | None = Field(description=WEBHOOK_OUT_DESCRIPTION)
    payload: dict[str, Any] = Field(
        description="what the run is (or was) dispatched with: its job's, with the "
        "overrides in `override_ids` applied"
    )
    override_ids: list[uuid.UUID] = Field(
        default_factory=list,
        description="the overrides that made its payload, timeout, priority and pool, in "
        "the merge order (GET /v1/runs/{id}/overrides shows them)",
    )
    attempt: int = Field(description="attempts made so far")
    max_attempts: int
    timeout: float
    heartbeat_timeout: float
    progress_timeout: float | None = Field(
        default=None, description="seconds a handler may go without reporting progress"
    )
    reason: str | None = Field(description="why the run was skipped, delayed or cancelled")
    wait_reason: str | None = Field(
        default=None,
        description="why a DISPATCHED run is still waiting: no live worker can take it "
        "(its pool, tenant, required capabilities, task and route tags), e.g. `no live "
        "worker in pool 'default' handles task 'ops.ping'`; null once one can",
    )
    last_error: str | None
    result: Any = None
    quarantined_at: UtcInstant | None = Field(
        default=None,
        description="set when a step of a scheduler pass failed on this run alone: the "
        "run was taken out of the pass as a DEAD_LETTER, the error in `reason` (a poison "
        "row never holds up anyone else's runs); a redrive sends it back and clears this",
    )
    workflow_run_id: uuid.UUID | None = Field(
        default=None, description="a workflow's node run: the workflow run it belongs to"
    )
    node: str | None = Field(default=None, description="a workflow's node run: its node")


# Tokens are 64-bit integers (a stale or unknown one answers 409); a number that does
# not even fit is refused before the store.
FencingToken = Annotated[
    Integer, Field(ge=-(2**63), le=2**63 - 1, description="the lease's fencing token")
]


class AttemptOut(ResponseModel):
    id: uuid.UUID
    number: int
    state: str
    worker_id: uuid.UUID | None
    worker_name: str | None = Field(
        default=None, description="the name its worker registered with (null: none given)"
    )
    fencing_token: int
    leased_at: UtcInstant | None = Field(
        default=None, description="when a worker leased it: the attempt began (= started_at)"
    )
    duration_ms: float | None = Field(
        default=None, description="from its lease to its end; null while it is live"
    )
    logs: str | None = Field(
        default=None,
        description="where its worker's log lines are read: `GET /v1/runs/{id}/logs` for "
        "this attempt (paged, oldest first)",
    )
    started_at: UtcInstant
    heartbeat_at: UtcInstant | None
    lease_expires_at: UtcInstant
    deadline: UtcInstant
    finished_at: UtcInstant | None
    error: str | None
    result: Any = None
    progress_at: UtcInstant | None = Field(
        default=None, description="when the handler last reported progress"
    )
    progress_details: Any = Field(default=None, description="the details of that report")
    progress_deadline: UtcInstant | None = Field(
        default=None,
        description="under the job's `progress_timeout`: the attempt times out when no "
        "progress is reported by then (its start, then each report, plus the timeout)",
    )


class EventOut(ResponseModel):
    id: int
    at: UtcInstant
    kind: str
    attempt_id: uuid.UUID | None
    from_state: str | None
    to_state: str | None
    actor: str | None
    reason: str | None
    data: dict[str, Any]


class AlertOut(ResponseModel):
    kind: Literal["unroutable_runs", "quarantined_runs", "missed_runs", "stalled_schedule"] = Field(
        description="unroutable_runs: dispatched runs no live worker can take; "
        "quarantined_runs: runs of one job a scheduler step failed on (poison rows), "
        "taken out of the pass as dead letters until redriven or the job is cancelled; "
        "missed_runs: runs of one job not dispatched within the job's lateness budget "
        "(clears when they are dispatched, cancelled or their job paused); "
        "stalled_schedule: a recurring job with no run to fire an occurrence already "
        "past its lateness budget (clears when the schedule produces runs again)"
    )
    tenant_id: uuid.UUID
    pool: str
    requires: list[str]
    route_tags: list[str] = Field(
        default_factory=list,
        description="unroutable_runs: the route tags of the runs (a worker's tags must "
        "include them all)",
    )
    runs: int = Field(description="how many runs the alert is about")
    since: UtcInstant = Field(
        description="when the longest-waiting of them was dispatched, the first of them "
        "quarantined, the earliest fire time of the missed ones, or when the schedule "
        "was found stalled"
    )
    message: str
    job_id: uuid.UUID | None = Field(
        default=None, description="quarantined_runs, missed_runs, stalled_schedule: the job"
    )
    run_ids: list[uuid.UUID] = Field(
        default_factory=list,
        description="quarantined_runs: the runs (up to 100, oldest first), to inspect and "
        "redrive; missed_runs: the missed runs (up to 100, oldest first)",
    )


class AlertList(ResponseModel):
    items: list[AlertOut]


class RunDetail(RunOut):
    attempts: list[AttemptOut]
    events: list[EventOut] = Field(description="the run's history, oldest first")
    events_next_cursor: str | None = None


class RunList(ResponseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null: this is the last"
    )


class EventList(ResponseModel):
    items: list[EventOut]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null: this is the last for now"
    )


class DeadLetterRedriveRequest(RequestModel):
    """Exactly one selector: ``run_ids``, ``job_id`` or ``all``."""

    run_ids: list[uuid.UUID] | None = Field(
        default=None,
        min_length=1,
        max_length=REDRIVE_BATCH_MAX,
        description="these runs; an id that is not one of the tenant's dead letters is skipped",
    )
    job_id: uuid.UUID | None = Field(default=None, description="the dead letters of this job")
    all: Flag = Field(default=False, description="every dead letter of the tenant")
    reason: str | None = Field(default=None, max_length=1000, description="recorded in history")
    limit: Integer = Field(
        default=REDRIVE_BATCH_MAX,
        ge=1,
        le=REDRIVE_BATCH_MAX,
        description="the most runs sent back, oldest first; `more` says whether others remain",
    )


class SkippedRun(ResponseModel):
    run_id: uuid.UUID
    reason: str = Field(description="why it was not sent back")


class DeadLetterRedriveOut(ResponseModel):
    redriven: int = Field(description="how many runs were sent back")
    run_ids: list[uuid.UUID] = Field(description="the runs sent back, oldest first")
    skipped: list[SkippedRun] = Field(description="named runs not sent back, in the order given")
    more: bool = Field(description="dead letters matching the selector remain past the limit")
