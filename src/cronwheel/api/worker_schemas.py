"""Request and response bodies of the worker protocol (register, lease, start,
heartbeat, complete, fail, release) and of worker logs. The rules of the API's other
bodies hold (``api/schemas.py``)."""

from __future__ import annotations

import uuid
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from cronwheel.api.progress import ProgressReport
from cronwheel.api.schemas import (
    FencingToken,
    RequestModel,
    ResponseModel,
    UtcInstant,
    UtcRequestInstant,
)
from cronwheel.domain.bounds import (
    Flag,
    Integer,
    Label,
    Name,
    Seconds,
)
from cronwheel.domain.spec import MAX_RETRY_AFTER

__all__ = [
    "LOG_LINES_MAX",
    "LOG_MESSAGE_MAX",
    "TASKS_MAX",
    "AttemptRef",
    "AttemptResultOut",
    "BatchOut",
    "BatchRequest",
    "CancelOut",
    "CancelsOut",
    "CancelsRequest",
    "CompleteItemIn",
    "CompleteRequest",
    "FailItemIn",
    "FailRequest",
    "Failure",
    "FencedRequest",
    "GateOpenedOut",
    "GatesOut",
    "GatesRequest",
    "HeartbeatItemIn",
    "HeartbeatOut",
    "HeartbeatRequest",
    "LeaseOut",
    "LeaseRequest",
    "LeasedAttemptOut",
    "LogAppendOut",
    "LogAppendRequest",
    "LogLineIn",
    "LogLineOut",
    "LogPageOut",
    "OutcomeOut",
    "StartOut",
    "StartRequest",
    "WorkerDeregistered",
    "WorkerList",
    "WorkerOut",
    "WorkerRegister",
    "WorkerRegistered",
]


# -- worker protocol -------------------------------------------------------------------


TASKS_MAX = 1000  # task names one worker may declare


class WorkerRegister(RequestModel):
    pool: Label = "default"
    capabilities: list[Label] = Field(default_factory=list, max_length=100)
    tags: list[Label] = Field(
        default_factory=list,
        max_length=100,
        description="execution tags: the worker leases a run only when these include all "
        "of the run's `route_tags`",
    )
    capacity: Integer = Field(default=1, ge=1, le=10_000)
    name: Name | None = None
    webhooks_only: Flag = Field(
        default=False,
        description="the worker calls webhooks and runs no tasks: it does not count as "
        "able to take the pool's task runs",
    )
    tasks: list[Name] | None = Field(
        default=None,
        max_length=TASKS_MAX,
        description="the task names the worker runs: it is leased only runs of these "
        "tasks (webhook runs, which have no task, as its capabilities allow), and a run "
        "whose task no live worker of its pool runs waits with a reason and an alert. "
        "null (the default): it takes any task. The Python SDK sends its handlers' names. "
        "Not with `webhooks_only`, which runs no tasks.",
    )


class WorkerRegistered(ResponseModel):
    worker_id: uuid.UUID
    tenant_id: uuid.UUID | None = Field(description="None: serves every tenant")
    tasks: list[str] | None = Field(
        default=None,
        description="the task names the worker is leased runs of (sorted, without "
        "repeats); null: any task",
    )
    heartbeat_interval: float = Field(description="seconds between heartbeats")
    lease_wait_max: float = Field(description="the longest `wait` a lease accepts")
    lease_ahead_max: float = Field(
        default=0.0, description="the most `ahead` a lease accepts (0: no reservations)"
    )
    start_ahead_max: float = Field(
        default=0.0,
        description="how long before its instant a reservation may be started (the run "
        "begins at its instant; 0: at the instant only)",
    )
    cancels_poll: bool = Field(
        default=False,
        description="the server answers `POST /v1/workers/{id}/cancels`, a long-poll that "
        "tells of a cancel as soon as it is asked (false, or absent: heartbeats only)",
    )
    gates_poll: bool = Field(
        default=False,
        description="the server takes `gated` on a lease and answers `POST "
        "/v1/workers/{id}/gates`: a worker may hold workflow nodes ahead of their "
        "upstream nodes' end (false, or absent: nodes are leased once ready)",
    )


class WorkerOut(ResponseModel):
    id: uuid.UUID
    name: str | None
    tenant_id: uuid.UUID | None = Field(description="None: serves every tenant of its pool")
    pool: str
    capabilities: list[str]
    tasks: list[str] | None = Field(description="the tasks it runs; null: any task")
    tags: list[str] = Field(description="its execution tags")
    webhooks_only: bool
    capacity: int = Field(description="its slots: the most attempts it holds at once")
    slots_in_use: int = Field(
        description="attempts it holds now (running) plus runs reserved for it (leased "
        "ahead, not started yet), at most its capacity (a worker whose handlers are short "
        "holds more of a burst than it has slots); to a tenant key, of that tenant's runs "
        "only (a shared worker's other work is not shown)"
    )
    running: int = Field(
        description="attempts it holds now (started ahead of their instant included)"
    )
    reserved: int = Field(description="runs reserved for it, not started yet")
    registered_at: UtcInstant
    last_seen_at: UtcInstant = Field(description="its last registration or lease call")
    live: bool = Field(
        description="counts for routing: not deregistered, and seen within the server's "
        "`worker_ttl` or holding an unexpired lease"
    )
    deregistered: bool
    deregistered_at: UtcInstant | None


class WorkerList(ResponseModel):
    items: list[WorkerOut]
    next_cursor: str | None


class WorkerDeregistered(ResponseModel):
    worker_id: uuid.UUID
    released: int = Field(
        description="attempts the worker still held, handed back: their runs are ready again"
    )


class LeaseRequest(RequestModel):
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
    reserve: Integer = Field(
        default=0,
        ge=0,
        le=1000,
        description="beyond `max`: once `max` is filled, up to this many more runs not "
        "due yet, as reservations (needs `ahead`): a worker whose handlers are short "
        "holds more of a burst than it has slots",
    )
    gated: Integer = Field(
        default=0,
        ge=0,
        le=1000,
        description="beyond `max` and `reserve`: up to this many workflow nodes whose "
        "upstream nodes are all under way, as gated reservations (`gated` true in the "
        "answer): begin each when `POST /v1/workers/{id}/gates` says its gate opened, "
        "with the payload it gives, then start it with `POST /v1/workers/{id}/start`",
    )


class LeasedAttemptOut(ResponseModel):
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
    priority: int = Field(
        default=2,
        description="the run's priority class, 0 (P0, the highest) .. 3: a worker holding "
        "leased runs that wait for a free slot starts the highest class first",
    )
    progress_timeout: float | None = Field(
        default=None,
        description="seconds: when set, report progress (`progress` on a heartbeat) within "
        "this long of the start and of each report, or the attempt ends TIMED_OUT",
    )
    workflow_run_id: uuid.UUID | None = Field(
        default=None,
        description="a workflow's node run: its workflow run. Its outcome makes the nodes "
        "after it ready, so a worker reports it without delay",
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
    gated: bool = Field(
        default=False,
        description="a gated reservation (leased with `gated`): a workflow node still "
        "waiting for its upstream nodes. It has not started and must not run until "
        "`POST /v1/workers/{id}/gates` says its gate opened; then run it with the payload "
        "given there and start it. `lease_expires_at` is when the reservation lapses "
        "unless its gate opens first.",
    )


class LeaseOut(ResponseModel):
    attempts: list[LeasedAttemptOut]
    now: UtcInstant = Field(description="the server's time: when a `not_before` comes")
    p0_reserved_slots: int = Field(
        default=0,
        description="this worker's slots that only P0 runs may take (its pool's "
        "p0_reserved_share of its capacity): a lease asking for no more runs than this "
        "gets P0 runs only, so a worker that has only these free should ask again as soon "
        "as another slot frees rather than long-poll",
    )


class CancelsRequest(RequestModel):
    wait: Seconds = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="seconds to long-poll when no cancel is pending (at most the server's "
        "`lease_wait_max`)",
    )
    known: list[FencingToken] = Field(
        default_factory=list,
        max_length=10_000,
        description="fencing tokens whose cancel the worker already knows of: left out of "
        "the answer",
    )


class CancelOut(ResponseModel):
    attempt_id: uuid.UUID
    run_id: uuid.UUID
    fencing_token: int


class CancelsOut(ResponseModel):
    cancels: list[CancelOut] = Field(
        description="the worker's running attempts whose run was asked to stop, but those "
        "in `known`: stop each handler as a heartbeat's `cancel_requested` says"
    )


class FencedRequest(RequestModel):
    fencing_token: FencingToken


class CompleteRequest(FencedRequest):
    result: Any = None


class Failure(RequestModel):
    """What a worker says of a failed attempt (alone or in a batch)."""

    error: str = Field(min_length=1, max_length=20_000)
    retryable: Flag = True
    retry_after: Seconds | None = Field(
        default=None,
        ge=0,
        le=MAX_RETRY_AFTER,
        description="seconds: the next attempt starts no sooner (the longer of this and "
        "the retry policy's backoff), e.g. from an HTTP `Retry-After`; only with "
        "`retryable` (no attempt follows one that is not)",
    )

    @model_validator(mode="after")
    def _retry_after_retryable(self) -> Self:
        """``retry_after`` on a failure that is not retryable would set nothing."""
        if self.retry_after is not None and not self.retryable:
            raise ValueError(
                "retry_after: a failure that is not retryable has no next attempt to delay"
            )
        return self


class FailRequest(Failure, FencedRequest):
    pass


class HeartbeatRequest(FencedRequest, ProgressReport):
    pass


class HeartbeatOut(ResponseModel):
    attempt_id: uuid.UUID
    lease_expires_at: UtcInstant | None
    cancel_requested: bool


class AttemptResultOut(ResponseModel):
    attempt_id: uuid.UUID
    ok: bool
    run_state: str | None = Field(default=None, description="the run's state afterwards")


class AttemptRef(RequestModel):
    attempt_id: uuid.UUID
    fencing_token: FencingToken


class HeartbeatItemIn(AttemptRef, ProgressReport):
    pass


class CompleteItemIn(AttemptRef):
    result: Any = None


class FailItemIn(Failure, AttemptRef):
    pass


class BatchRequest(RequestModel):
    heartbeats: list[HeartbeatItemIn] = Field(default_factory=list, max_length=1000)
    completions: list[CompleteItemIn] = Field(default_factory=list, max_length=1000)
    failures: list[FailItemIn] = Field(default_factory=list, max_length=1000)
    releases: list[AttemptRef] = Field(default_factory=list, max_length=1000)


class OutcomeOut(ResponseModel):
    attempt_id: uuid.UUID
    ok: bool
    error: str | None = Field(
        default=None, description="when not ok: `stale_fencing_token` or `not_found`"
    )
    lease_expires_at: UtcInstant | None = None
    cancel_requested: bool = False
    run_state: str | None = None


class BatchOut(ResponseModel):
    heartbeats: list[OutcomeOut]
    completions: list[OutcomeOut]
    failures: list[OutcomeOut]
    releases: list[OutcomeOut]


class GatesRequest(RequestModel):
    fencing_tokens: list[FencingToken] = Field(
        min_length=1,
        max_length=10_000,
        description="the gated reservations to hear of, by token",
    )
    wait: Seconds = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="seconds to long-poll when no gate opened and none is gone (at most "
        "the server's `lease_wait_max`)",
    )


class GateOpenedOut(ResponseModel):
    fencing_tokens: list[int] = Field(description="reservations whose gates opened together")
    payload: dict[str, Any] = Field(
        description="each node's payload as its gate's opening gave it: the one to run it "
        "with (its upstream nodes' results in it)"
    )
    opened_at: UtcInstant = Field(description="when their gates opened: the nodes began then")


class GatesOut(ResponseModel):
    opened: list[GateOpenedOut] = Field(
        description="reservations whose gate opened, by opening: begin each, then start it "
        "(`start`)"
    )
    gone: list[int] = Field(
        description="reservations no longer yours (lapsed, handed back, or the node was "
        "cancelled or skipped): drop them, the node must not run here"
    )


class StartRequest(RequestModel):
    fencing_tokens: list[FencingToken] = Field(
        min_length=1, max_length=1000, description="the reservations to start, by token"
    )


class StartOut(ResponseModel):
    started_at: UtcInstant | None = Field(
        description="the earliest beginning of the started ones: each begins at the later "
        "of this and its `not_before` (started ahead, at its instant); its attempt's lease "
        "runs to its beginning plus its heartbeat timeout, its deadline to its beginning "
        "plus its timeout"
    )
    started: list[int] = Field(
        description="tokens now running, each from its beginning: their attempts are yours"
    )
    not_yet: list[int] = Field(
        description="tokens due later than `start_ahead_max` from now: nothing changed; "
        "try again closer to their `not_before`"
    )
    refused: list[int] = Field(
        description="tokens whose reservation is gone (the run was cancelled or paused, or "
        "the reservation lapsed and another worker took it): drop them"
    )
    now: UtcInstant = Field(
        description="the server's time as it answered: as in a lease answer, what a worker "
        "tells the instants of its started runs by"
    )


# -- worker logs -----------------------------------------------------------------------

LOG_LINES_MAX = 1000  # lines per append
LOG_MESSAGE_MAX = 16_384  # characters per line


class LogLineIn(RequestModel):
    ts: UtcRequestInstant = Field(description="when the line was written")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    message: str = Field(max_length=LOG_MESSAGE_MAX)


class LogAppendRequest(FencedRequest):
    lines: list[LogLineIn] = Field(min_length=1, max_length=LOG_LINES_MAX)


class LogAppendOut(ResponseModel):
    attempt_id: uuid.UUID
    accepted: int = Field(description="lines kept")
    dropped: int = Field(description="lines past the attempt's log cap, not kept")
    size: int = Field(description="bytes the attempt's log takes now")


class LogLineOut(ResponseModel):
    ts: UtcInstant
    attempt: int
    level: str
    message: str


class LogPageOut(ResponseModel):
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
