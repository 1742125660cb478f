"""Request and response bodies of the REST API (the job itself is
:class:`cronwheel.domain.spec.JobSpec`).

Requests forbid unknown fields so a typo is an error. Every instant in a response is
UTC with ``Z``; where a time zone applies the local form with its offset sits beside it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cronwheel.api.progress import ProgressReport
from cronwheel.api.redaction import WEBHOOK_OUT_DESCRIPTION
from cronwheel.domain.bounds import (
    BACKFILL_RATE_MAX,
    BACKFILL_RATE_MIN,
    Flag,
    Instant,
    Integer,
    Label,
    Name,
    Seconds,
)
from cronwheel.domain.spec import MAX_RETRY_AFTER, TenantLimits
from cronwheel.store.values import REDRIVE_BATCH_MAX

__all__ = [
    "ERROR_RESPONSES",
    "LOG_LINES_MAX",
    "LOG_MESSAGE_MAX",
    "AlertList",
    "AlertOut",
    "AttemptOut",
    "AttemptRef",
    "AttemptResultOut",
    "BackfillOut",
    "BackfillRequest",
    "BatchOut",
    "BatchRequest",
    "CancelRequest",
    "CompleteItemIn",
    "CompleteRequest",
    "DeadLetterRedriveOut",
    "DeadLetterRedriveRequest",
    "ErrorDetail",
    "ErrorResponse",
    "EventOut",
    "FailItemIn",
    "FailRequest",
    "FencedRequest",
    "FencingToken",
    "HeartbeatItemIn",
    "HeartbeatOut",
    "HeartbeatRequest",
    "JobControlRequest",
    "JobList",
    "JobOut",
    "KeyCreate",
    "KeyCreated",
    "LeaseOut",
    "LeaseRequest",
    "LeasedAttemptOut",
    "LogAppendOut",
    "LogAppendRequest",
    "LogLineIn",
    "LogLineOut",
    "LogPageOut",
    "OutcomeOut",
    "PreviewItem",
    "PreviewOut",
    "RunDetail",
    "RunList",
    "RunOut",
    "SkippedRun",
    "StartOut",
    "StartRequest",
    "TenantCreate",
    "TenantCreated",
    "TenantList",
    "TenantOut",
    "TenantUpdate",
    "TriggerRequest",
    "UtcInstant",
    "WebhookSecretOut",
    "WorkerDeregistered",
    "WorkerRegister",
    "WorkerRegistered",
]


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcInstant = Annotated[datetime, AfterValidator(_to_utc)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


# -- errors ----------------------------------------------------------------------------


class ErrorDetail(_Out):
    code: str = Field(description="stable machine-readable code, e.g. `invalid_schedule`")
    message: str = Field(description="what went wrong, for people")
    field: str | None = Field(default=None, description="dotted path of the offending field")
    details: dict[str, Any] | None = None


class ErrorResponse(_Out):
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


# -- tenants ---------------------------------------------------------------------------


class TenantCreate(_In):
    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="unique; letters, digits, '.', '_' and '-'",
    )
    limits: TenantLimits | None = None


class TenantUpdate(_In):
    limits: TenantLimits = Field(description="only the fields given change")


class TenantOut(_Out):
    id: uuid.UUID
    name: str
    limits: dict[str, Any]
    created_at: UtcInstant


class TenantCreated(TenantOut):
    api_key: str = Field(description="an operator key for the tenant; shown only once")
    key_id: uuid.UUID
    key_prefix: str


class TenantList(_Out):
    items: list[TenantOut]
    next_cursor: str | None


class WebhookSecretOut(_Out):
    tenant_id: uuid.UUID
    webhook_secret: str = Field(
        description="the key of the HMAC-SHA256 in each webhook request's "
        "`Cronwheel-Signature` (see docs/webhooks.md)"
    )


class KeyCreate(_In):
    role: Literal["operator", "viewer", "worker"]


class KeyCreated(_Out):
    id: uuid.UUID
    tenant_id: uuid.UUID
    role: str
    prefix: str
    api_key: str = Field(description="the key; shown only once")
    created_at: UtcInstant


# -- jobs ------------------------------------------------------------------------------


class JobOut(_Out):
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
    tags: list[str]
    priority: int
    retry: dict[str, Any]
    timeout: float
    heartbeat_timeout: float
    progress_timeout: float | None = Field(
        default=None, description="seconds a handler may go without reporting progress"
    )
    next_due_at: UtcInstant | None
    version: int
    created_at: UtcInstant
    updated_at: UtcInstant
    idempotency_key: str | None = None
    first_run_id: uuid.UUID | None = Field(
        default=None, description="the run created with the job (in the answer to its creation)"
    )


class JobList(_Out):
    items: list[JobOut]
    next_cursor: str | None


class CancelRequest(_In):
    reason: str | None = Field(default=None, max_length=1000)


class JobControlRequest(_In):
    """The body of pause and resume (optional)."""

    reason: str | None = Field(
        default=None, max_length=1000, description="recorded in the job's history"
    )


class TriggerRequest(_In):
    payload: dict[str, Any] | None = Field(
        default=None, description="merged over the job's payload for this run only"
    )


class BackfillRequest(_In):
    start: Instant = Field(alias="from", description="the first instant of the range (inclusive)")
    end: Instant = Field(alias="to", description="the end of the range (exclusive); not after now")
    rate: Seconds = Field(
        default=10.0,
        ge=BACKFILL_RATE_MIN,
        le=BACKFILL_RATE_MAX,
        description="runs released per second, from now",
    )


class BackfillOut(_Out):
    created: int = Field(description="runs created (occurrences that had one already get none)")
    runs: list[uuid.UUID] = Field(description="the ids of the runs created, oldest due first")


class PreviewItem(_Out):
    due_at: UtcInstant
    due_local: str = Field(
        description="the local wall time with its own offset (the UTC form where no "
        "time zone applies); a wall time skipped by a DST gap has no offset"
    )
    kind: str = Field(description="normal | ambiguous-first | ambiguous-second | shifted | skipped")
    reason: str | None = Field(default=None, description="why the occurrence is shifted or skipped")


class PreviewOut(_Out):
    items: list[PreviewItem]


# -- runs ------------------------------------------------------------------------------


class RunOut(_Out):
    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    job_name: str | None
    state: str = Field(description="SCHEDULED | DISPATCHED | RUNNING | SUCCESS | FAILED | …")
    origin: str = Field(
        description="once | schedule | trigger | backfill | replay: what made the run",
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
    tags: list[str]
    task: str | None
    webhook: dict[str, Any] | None = Field(description=WEBHOOK_OUT_DESCRIPTION)
    payload: dict[str, Any]
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
        "(its pool, tenant and required capabilities); null once one can",
    )
    last_error: str | None
    result: Any = None
    quarantined_at: UtcInstant | None = Field(
        default=None,
        description="set when a step of a scheduler pass failed on this run alone: the "
        "run was taken out of the pass as a DEAD_LETTER, the error in `reason` (a poison "
        "row never holds up anyone else's runs); a redrive sends it back and clears this",
    )


# Tokens are 64-bit integers (a stale or unknown one answers 409); a number that does
# not even fit is refused before the store.
FencingToken = Annotated[
    Integer, Field(ge=-(2**63), le=2**63 - 1, description="the lease's fencing token")
]


class AttemptOut(_Out):
    id: uuid.UUID
    number: int
    state: str
    worker_id: uuid.UUID | None
    fencing_token: int
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


class EventOut(_Out):
    id: int
    at: UtcInstant
    kind: str
    attempt_id: uuid.UUID | None
    from_state: str | None
    to_state: str | None
    actor: str | None
    reason: str | None
    data: dict[str, Any]


class AlertOut(_Out):
    kind: Literal["unroutable_runs", "quarantined_runs"] = Field(
        description="unroutable_runs: dispatched runs no live worker can take; "
        "quarantined_runs: runs of one job a scheduler step failed on (poison rows), taken "
        "out of the pass as dead letters until redriven or the job is cancelled"
    )
    tenant_id: uuid.UUID
    pool: str
    requires: list[str]
    runs: int = Field(description="how many runs the alert is about")
    since: UtcInstant = Field(
        description="when the longest-waiting of them was dispatched, or the first of "
        "them quarantined"
    )
    message: str
    job_id: uuid.UUID | None = Field(default=None, description="quarantined_runs: the job")
    run_ids: list[uuid.UUID] = Field(
        default_factory=list,
        description="quarantined_runs: the runs (up to 100, oldest first), to inspect and redrive",
    )


class AlertList(_Out):
    items: list[AlertOut]


class RunDetail(RunOut):
    attempts: list[AttemptOut]
    events: list[EventOut] = Field(description="the run's history, oldest first")
    events_next_cursor: str | None = None


class RunList(_Out):
    items: list[RunOut]
    next_cursor: str | None


class DeadLetterRedriveRequest(_In):
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


class SkippedRun(_Out):
    run_id: uuid.UUID
    reason: str = Field(description="why it was not sent back")


class DeadLetterRedriveOut(_Out):
    redriven: int = Field(description="how many runs were sent back")
    run_ids: list[uuid.UUID] = Field(description="the runs sent back, oldest first")
    skipped: list[SkippedRun] = Field(description="named runs not sent back, in the order given")
    more: bool = Field(description="dead letters matching the selector remain past the limit")


# -- worker protocol -------------------------------------------------------------------


class WorkerRegister(_In):
    pool: Label = "default"
    capabilities: list[Label] = Field(default_factory=list, max_length=100)
    tags: list[Label] = Field(default_factory=list, max_length=100)
    capacity: Integer = Field(default=1, ge=1, le=10_000)
    name: Name | None = None
    webhooks_only: Flag = Field(
        default=False,
        description="the worker calls webhooks and runs no tasks: it does not count as "
        "able to take the pool's task runs",
    )


class WorkerRegistered(_Out):
    worker_id: uuid.UUID
    tenant_id: uuid.UUID | None = Field(description="None: serves every tenant")
    heartbeat_interval: float = Field(description="seconds between heartbeats")
    lease_wait_max: float = Field(description="the longest `wait` a lease accepts")
    lease_ahead_max: float = Field(
        default=0.0, description="the most `ahead` a lease accepts (0: no reservations)"
    )


class WorkerDeregistered(_Out):
    worker_id: uuid.UUID
    released: int = Field(
        description="attempts the worker still held, handed back: their runs are ready again"
    )


class LeaseRequest(_In):
    max: Integer = Field(default=1, ge=1, le=1000, description="most attempts to lease")
    wait: Seconds = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="seconds to long-poll when none is ready (at most the server's "
        "`lease_wait_max`)",
    )
    webhooks_only: Flag = Field(
        default=False,
        description="lease webhook runs only (a worker that calls webhooks and runs no tasks)",
    )
    ahead: Seconds = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="seconds: also lease runs due within this long, as reservations the "
        "worker starts at their instant with `POST /v1/workers/{id}/start`",
    )


class LeasedAttemptOut(_Out):
    attempt_id: uuid.UUID
    run_id: uuid.UUID
    job_id: uuid.UUID
    tenant_id: uuid.UUID
    attempt: int = Field(description="the attempt number, 1 for the first try")
    task: str | None
    webhook: dict[str, Any] | None = Field(
        description="the webhook to call, header values included: the one answer that "
        "carries them (the worker role's); every other answer hides them"
    )
    payload: dict[str, Any]
    fencing_token: int = Field(description="send with every call about this attempt")
    lease_expires_at: UtcInstant
    deadline: UtcInstant = Field(description="the attempt times out at this instant")
    due_at: UtcInstant
    heartbeat_timeout: float
    progress_timeout: float | None = Field(
        default=None,
        description="seconds: when set, report progress (`progress` on a heartbeat) within "
        "this long of the start and of each report, or the attempt ends TIMED_OUT",
    )
    signing_secret: str | None = Field(
        default=None,
        description="webhook runs only: the tenant's secret to sign the request with",
    )
    not_before: UtcInstant | None = Field(
        default=None,
        description="set on a reservation: the attempt has not started; start it at this "
        "instant or later with `POST /v1/workers/{id}/start` (a cancel or pause before then "
        "wins). Until then `lease_expires_at` is when the reservation lapses and `deadline` "
        "assumes a start at `not_before`.",
    )


class LeaseOut(_Out):
    attempts: list[LeasedAttemptOut]
    now: UtcInstant = Field(description="the server's time: when a `not_before` comes")


class FencedRequest(_In):
    fencing_token: FencingToken


class CompleteRequest(FencedRequest):
    result: Any = None


class FailRequest(FencedRequest):
    error: str = Field(min_length=1, max_length=20_000)
    retryable: Flag = True
    retry_after: Seconds | None = Field(
        default=None,
        ge=0,
        le=MAX_RETRY_AFTER,
        description="seconds: the next attempt starts no sooner (the longer of this and "
        "the retry policy's backoff), e.g. from an HTTP `Retry-After`",
    )


class HeartbeatRequest(FencedRequest, ProgressReport):
    pass


class HeartbeatOut(_Out):
    attempt_id: uuid.UUID
    lease_expires_at: UtcInstant | None
    cancel_requested: bool


class AttemptResultOut(_Out):
    attempt_id: uuid.UUID
    ok: bool
    run_state: str | None = Field(default=None, description="the run's state afterwards")


class AttemptRef(_In):
    attempt_id: uuid.UUID
    fencing_token: FencingToken


class HeartbeatItemIn(AttemptRef, ProgressReport):
    pass


class CompleteItemIn(AttemptRef):
    result: Any = None


class FailItemIn(AttemptRef):
    error: str = Field(min_length=1, max_length=20_000)
    retryable: Flag = True
    retry_after: Seconds | None = Field(
        default=None,
        ge=0,
        le=MAX_RETRY_AFTER,
        description="seconds: the next attempt starts no sooner (the longer of this and "
        "the retry policy's backoff), e.g. from an HTTP `Retry-After`",
    )


class BatchRequest(_In):
    heartbeats: list[HeartbeatItemIn] = Field(default_factory=list, max_length=1000)
    completions: list[CompleteItemIn] = Field(default_factory=list, max_length=1000)
    failures: list[FailItemIn] = Field(default_factory=list, max_length=1000)
    releases: list[AttemptRef] = Field(default_factory=list, max_length=1000)


class OutcomeOut(_Out):
    attempt_id: uuid.UUID
    ok: bool
    error: str | None = Field(
        default=None, description="when not ok: `stale_fencing_token` or `not_found`"
    )
    lease_expires_at: UtcInstant | None = None
    cancel_requested: bool = False
    run_state: str | None = None


class BatchOut(_Out):
    heartbeats: list[OutcomeOut]
    completions: list[OutcomeOut]
    failures: list[OutcomeOut]
    releases: list[OutcomeOut]


class StartRequest(_In):
    fencing_tokens: list[FencingToken] = Field(
        min_length=1, max_length=1000, description="the reservations to start, by token"
    )


class StartOut(_Out):
    started_at: UtcInstant | None = Field(
        description="when the started ones started: each attempt's lease runs to this plus "
        "its heartbeat timeout, its deadline to this plus its timeout"
    )
    started: list[int] = Field(description="tokens now running: their attempts are yours")
    not_yet: list[int] = Field(
        description="tokens due later: nothing changed; try at their `not_before`"
    )
    refused: list[int] = Field(
        description="tokens whose reservation is gone (the run was cancelled or paused, or "
        "the reservation lapsed and another worker took it): drop them"
    )


# -- worker logs -----------------------------------------------------------------------

LOG_LINES_MAX = 1000  # lines per append
LOG_MESSAGE_MAX = 16_384  # characters per line


class LogLineIn(_In):
    ts: Annotated[Instant, AfterValidator(_to_utc)] = Field(description="when the line was written")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    message: str = Field(max_length=LOG_MESSAGE_MAX)


class LogAppendRequest(FencedRequest):
    lines: list[LogLineIn] = Field(min_length=1, max_length=LOG_LINES_MAX)


class LogAppendOut(_Out):
    attempt_id: uuid.UUID
    accepted: int = Field(description="lines kept")
    dropped: int = Field(description="lines past the attempt's log cap, not kept")
    size: int = Field(description="bytes the attempt's log takes now")


class LogLineOut(_Out):
    ts: UtcInstant
    attempt: int
    level: str
    message: str


class LogPageOut(_Out):
    run_id: uuid.UUID
    run_state: str = Field(
        description="the run's state when the lines were read: once it is final, "
        "every line is there"
    )
    lines: list[LogLineOut] = Field(description="oldest first, attempt by attempt")
    next_cursor: str | None = Field(description="more lines are there: pass it as `cursor`")
    end_cursor: str = Field(
        description="where this page ended: pass it as `cursor` later to read only newer lines"
    )
