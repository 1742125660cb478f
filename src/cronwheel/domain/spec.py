"""What a user hands cronwheel: the validated definition of a job.

These models are the request bodies of the API and the arguments of the store; they
forbid unknown fields so that a typo is an error, never silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from cronwheel.domain.bounds import (
    CATCH_UP_WINDOW_MAX,
    DELAY_MAX,
    HEARTBEAT_TIMEOUT_MAX,
    INTERVAL_MAX,
    INTERVAL_MIN,
    RETRY_AFTER_MAX,
    RETRY_DELAY_MAX,
    SPREAD_MAX,
    TIMEOUT_MAX,
    Instant,
    Integer,
    Label,
    Name,
    Seconds,
)

__all__ = [
    "LATENESS_BUDGET_DEFAULT",
    "LATENESS_BUDGET_MAX",
    "MAX_CRON_LENGTH",
    "MAX_RETRY_AFTER",
    "ONE_OFF_KINDS",
    "REDACTED",
    "WEBHOOK_CAPABILITY",
    "AsapSchedule",
    "AtSchedule",
    "CronSchedule",
    "DelaySchedule",
    "IntervalSchedule",
    "JobSpec",
    "RetryPolicy",
    "RunSpec",
    "ScheduleSpec",
    "TenantLimits",
    "WebhookSpec",
    "parse_schedule",
    "redact_webhook",
    "schedule_kind",
    "utc_iso",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AtSchedule(_Strict):
    """One run at an instant (ISO-8601 with an offset)."""

    at: Instant


class DelaySchedule(_Strict):
    """One run ``delay`` seconds after the job is accepted."""

    delay: Seconds = Field(ge=0, le=DELAY_MAX)


def _exactly_true(value: Any) -> Any:
    # A literal compares by value, so 1 and 1.0 would pass as True.
    if value is not True:
        raise ValueError("asap must be true")
    return value


class AsapSchedule(_Strict):
    """One run as soon as possible."""

    asap: Annotated[Literal[True], BeforeValidator(_exactly_true)]


MAX_CRON_LENGTH = 256
"""The longest cron expression accepted, in characters: far more than any real one."""

_CRON_SYNTAX = (
    "5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second "
    "field; numbers, month and weekday names, '*', lists 'a,b', ranges 'a-b' and steps "
    "'*/n' or 'a-b/n'; or a macro (@yearly @annually @monthly @weekly @daily @midnight "
    f"@hourly). At most {MAX_CRON_LENGTH} characters; a field has at most as many list "
    "items as it has values (60 for minutes, 7 for weekdays); a step is 1 to that number "
    "(*/60 is minute 0 of every hour); a range runs from low to high and does not wrap: "
    "write 22-23,0-2 for 22-2, fri-sat,sun-mon for fri-mon. When both day fields are "
    "restricted, a day matches if either does."
)


class CronSchedule(_Strict):
    """Recurring runs from a cron expression evaluated on the wall clock of ``timezone``."""

    # The bound is enforced by the time engine's parser, which refuses with the same
    # ``invalid_schedule`` error as every other cron rule; the schema only shows it.
    cron: str = Field(description=_CRON_SYNTAX, json_schema_extra={"maxLength": MAX_CRON_LENGTH})
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    on_ambiguous: Literal["first", "all"] = "first"
    on_nonexistent: Literal["shift", "skip"] = "shift"
    catch_up: Literal["replay", "coalesce", "skip"] = "coalesce"
    catch_up_window: Seconds = Field(default=3600.0, gt=0, le=CATCH_UP_WINDOW_MAX)
    overlap: Literal["allow", "skip", "queue_one", "cancel_previous"] = "allow"


class IntervalSchedule(_Strict):
    """Recurring runs every ``interval`` seconds of elapsed time (immune to DST)."""

    interval: Seconds = Field(
        ge=INTERVAL_MIN,
        le=INTERVAL_MAX,
        description="seconds of elapsed time between occurrences, counted from `start`",
    )
    start: Instant | None = Field(
        default=None,
        description="the first occurrence; the next ones every `interval` after it. "
        "Without it, intervals count from the Unix epoch (1970-01-01T00:00:00Z): an "
        "interval of 60 falls at each minute's start, UTC",
    )
    catch_up: Literal["replay", "coalesce", "skip"] = "coalesce"
    catch_up_window: Seconds = Field(default=3600.0, gt=0, le=CATCH_UP_WINDOW_MAX)
    overlap: Literal["allow", "skip", "queue_one", "cancel_previous"] = "allow"


ScheduleSpec = AtSchedule | DelaySchedule | AsapSchedule | CronSchedule | IntervalSchedule

_SCHEDULE_KEYS: dict[str, type[_Strict]] = {
    "at": AtSchedule,
    "delay": DelaySchedule,
    "asap": AsapSchedule,
    "cron": CronSchedule,
    "interval": IntervalSchedule,
}


_SCHEDULE_MODELS = tuple(_SCHEDULE_KEYS.values())


_RECURRING = (CronSchedule, IntervalSchedule)

ONE_OFF_KINDS = ("at", "delay", "asap")
"""The kinds of schedule with one run; ``cron`` and ``interval`` recur."""


_KIND_OF = {model: key for key, model in _SCHEDULE_KEYS.items()}


def schedule_kind(spec: ScheduleSpec) -> str:
    """``at`` | ``delay`` | ``asap`` | ``cron`` | ``interval``."""
    kind = _KIND_OF.get(type(spec))
    if kind is not None:
        return kind
    for key, model in _SCHEDULE_KEYS.items():
        if isinstance(spec, model):
            return key
    raise TypeError(f"not a schedule: {spec!r}")


def parse_schedule(value: Any) -> Any:
    """Pick the schedule model by its one distinguishing key, so errors name it (a
    model passes as it is)."""
    if isinstance(value, BaseModel):
        return value
    if not isinstance(value, dict):
        raise ValueError("schedule must be an object")
    kinds = [k for k in _SCHEDULE_KEYS if k in value]
    if len(kinds) != 1:
        raise ValueError(
            "schedule must have exactly one of 'at', 'delay', 'asap', 'cron', 'interval'"
        )
    return _SCHEDULE_KEYS[kinds[0]].model_validate(value)


MAX_RETRY_AFTER = RETRY_AFTER_MAX
"""The longest wait a worker may ask for before a retry (``retry_after``, seconds)."""


class RetryPolicy(_Strict):
    max_attempts: Integer = Field(default=3, ge=1, le=1000)
    initial_delay: Seconds = Field(default=1.0, ge=0, le=RETRY_DELAY_MAX)
    multiplier: Seconds = Field(default=2.0, ge=1.0, le=100.0)
    max_delay: Seconds = Field(default=300.0, ge=0, le=RETRY_DELAY_MAX)
    jitter: Literal["full", "equal", "none"] = "full"


_DEFAULT_RETRY = RetryPolicy()

WEBHOOK_CAPABILITY = "webhook"
"""The capability every webhook job requires implicitly: only a worker that calls
webhooks (the built-in webhook worker) declares it, so no other worker leases them."""

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Set by the webhook worker itself (framing, routing, or the signed cronwheel headers).
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "idempotency-key"}
)


class WebhookSpec(_Strict):
    """An HTTP call the built-in webhook worker makes for each run: the run's payload is
    the JSON body; see docs/webhooks.md for the headers and the signature."""

    url: HttpUrl
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict, max_length=50)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid header name")
            lower = name.lower()
            if lower in _RESERVED_HEADERS or lower.startswith("cronwheel-"):
                raise ValueError(f"header {name!r} is set by the webhook worker itself")
            if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in text):
                raise ValueError(f"the value of header {name!r} has a control character")
            if not text.isascii():
                raise ValueError(f"the value of header {name!r} is not ASCII text")
            if len(text) > 8192:
                raise ValueError(f"the value of header {name!r} is longer than 8192 characters")
        return value


REDACTED = "[redacted]"
"""What every answer and every recorded change shows in place of a webhook header's
value: the values are write-only (they carry the receiver's credentials)."""


def redact_webhook(webhook: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``webhook`` (a :class:`WebhookSpec`'s JSON) as it may be shown: every header
    value replaced by :data:`REDACTED`, the names kept."""
    if webhook is None:
        return None
    shown = dict(webhook)
    headers = shown.get("headers")
    if headers:
        shown["headers"] = dict.fromkeys(headers, REDACTED)
    return shown


LATENESS_BUDGET_DEFAULT = 30.0
"""Seconds a run may go undispatched past its fire time before it counts as missed."""
LATENESS_BUDGET_MAX = 86_400.0


class RunSpec(_Strict):
    """What each run is made of — its target, payload, routing, retries and timeouts:
    the template part of a job, and each node of a workflow (``domain/workflow.py``)."""

    task: Name | None = None
    webhook: WebhookSpec | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    pool: Label = "default"
    requires: list[Label] = Field(
        default_factory=list,
        max_length=50,
        description="capabilities a worker needs to lease the job's runs; a webhook job "
        f"always requires {WEBHOOK_CAPABILITY!r} (added when missing)",
    )
    tags: list[Label] = Field(
        default_factory=list,
        max_length=50,
        description="labels to find and filter the job and its runs by; they do not route",
    )
    route_tags: list[Label] = Field(
        default_factory=list,
        max_length=50,
        description="execution tags: only a worker whose tags include every one of them "
        "leases the job's runs (none by default: any worker of the pool)",
    )
    priority: Integer = Field(default=2, ge=0, le=3)
    # One default for every job (frozen, so never changed in place): not a new
    # model validated for each job that leaves it out.
    retry: RetryPolicy = Field(default_factory=lambda: _DEFAULT_RETRY)
    timeout: Seconds = Field(default=3600.0, gt=0, le=TIMEOUT_MAX)
    # 25 s by default: a worker beating every 10 s (the server's suggestion) may miss
    # two beats, and a dead one is detected within 25 s plus one expiry sweep (1 s),
    # under the 30 s liveness bound; at 30 s it never could be.
    heartbeat_timeout: Seconds = Field(default=25.0, ge=1, le=HEARTBEAT_TIMEOUT_MAX)
    progress_timeout: Seconds | None = Field(
        default=None,
        gt=0,
        description="seconds (at most `timeout`): the handler must report progress "
        "(`ctx.heartbeat`) within this long of the attempt's start and of each report, "
        "or the attempt ends TIMED_OUT and the run is retried; none by default",
    )

    @field_validator("progress_timeout")
    @classmethod
    def _progress_timeout(cls, value: float | None, info: ValidationInfo) -> float | None:
        # A webhook call reports no progress: on a webhook job the bound would only be a
        # second, shorter ``timeout``.
        if value is not None and info.data.get("webhook") is not None:
            raise ValueError("a webhook job reports no progress; bound the call with 'timeout'")
        timeout = info.data.get("timeout")
        if value is not None and timeout is not None and value > timeout:
            raise ValueError(f"must be at most the job's timeout ({timeout:g} s)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _webhook_requires(cls, data: Any) -> Any:
        """A webhook job requires the ``webhook`` capability, so that only a worker
        able to call webhooks ever leases its runs."""
        if isinstance(data, dict) and data.get("webhook") is not None:
            requires = data.get("requires")
            if requires is None:
                data = {**data, "requires": [WEBHOOK_CAPABILITY]}
            elif isinstance(requires, list | tuple) and WEBHOOK_CAPABILITY not in requires:
                data = {**data, "requires": [*requires, WEBHOOK_CAPABILITY]}
        return data

    @model_validator(mode="after")
    def _one_target(self) -> RunSpec:
        if (self.task is None) == (self.webhook is None):
            raise ValueError("a job needs exactly one of 'task' or 'webhook'")
        return self


class JobSpec(RunSpec):
    """A job as submitted: its schedule and the template of each of its runs."""

    name: Name
    schedule: Annotated[
        ScheduleSpec, Field(description="one of at / delay / asap / cron / interval")
    ]
    spread: Seconds = Field(
        default=0.0,
        ge=0,
        le=SPREAD_MAX,
        description="seconds (a millisecond's resolution, at most a day): each run fires at "
        "an offset in [0, spread) after its due instant, the same for a given job and "
        "occurrence on every node; a recurring job's spread must be shorter than its "
        "schedule's shortest interval. 0 (the default): runs fire at their due instant",
    )
    lateness_budget: Seconds = Field(
        default=LATENESS_BUDGET_DEFAULT,
        ge=1,
        le=LATENESS_BUDGET_MAX,
        description="seconds (1 to a day) a run may go undispatched past its fire time "
        "before it counts as missed: a `run.missed` event, the `missed_runs` alert and "
        "the `cronwheel_runs_missed` counter (docs/alerts.md); a recurring job whose next "
        "occurrence is this late with no run to fire it raises `stalled_schedule`. 30 by "
        "default",
    )

    @field_validator("spread")
    @classmethod
    def _spread(cls, value: float) -> float:
        # Whole milliseconds: the offset is computed in integer microseconds from it, in
        # Python and in SQL, and both must read the same number of them.
        return round(value, 3)

    @field_validator("schedule", mode="wrap")
    @classmethod
    def _schedule(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The model its key names, validated once: handed to the union instead, it
        # would be checked against every member again (and read attribute by attribute
        # where FastAPI validates bodies ``from_attributes``).
        parsed = parse_schedule(value)
        return parsed if isinstance(parsed, _SCHEDULE_MODELS) else handler(parsed)

    @property
    def is_recurring(self) -> bool:
        # A tuple: ``isinstance`` with a union costs five times more.
        return isinstance(self.schedule, _RECURRING)


class TenantLimits(_Strict):
    """Per-tenant limits, enforced by admission control on every node (the database is
    the authority; docs/admission.md). ``None``: no limit."""

    max_concurrent_runs: Integer | None = Field(
        default=None, ge=1, le=1_000_000, description="runs leased or running at once"
    )
    max_dispatch_rate: Seconds | None = Field(
        default=None, gt=0, le=1_000_000, description="runs handed to workers per second"
    )
    dispatch_burst: Integer | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="runs that may be handed out at once above the rate "
        "(default: one second's worth of max_dispatch_rate, at least 1)",
    )
    max_pending_runs: Integer | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="runs scheduled or waiting for a worker; creating more is refused (429)",
    )
    api_rate: Seconds | None = Field(
        default=None, gt=0, le=1_000_000, description="API requests per second per key"
    )
    api_burst: Integer | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="API requests a key may make at once above api_rate "
        "(default: twice api_rate, at least 1)",
    )
    weight: Seconds = Field(
        default=1.0, gt=0, le=1000, description="share of a contended pool, against other tenants"
    )


def utc_iso(value: datetime) -> str:
    """An aware instant as ISO-8601 in UTC with ``Z``."""
    text = value.isoformat()
    return text.replace("+00:00", "Z")
