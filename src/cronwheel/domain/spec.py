"""What a user hands cronwheel: the validated definition of a job.

These models are the request bodies of the API and the arguments of the store; they
forbid unknown fields so that a typo is an error, never silently ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    field_validator,
    model_validator,
)

__all__ = [
    "AsapSchedule",
    "AtSchedule",
    "CronSchedule",
    "DelaySchedule",
    "IntervalSchedule",
    "JobSpec",
    "RetryPolicy",
    "ScheduleSpec",
    "TenantLimits",
    "WebhookSpec",
    "schedule_kind",
    "utc_iso",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AtSchedule(_Strict):
    """One run at an instant (ISO-8601 with an offset)."""

    at: AwareDatetime


class DelaySchedule(_Strict):
    """One run ``delay`` seconds after the job is accepted."""

    delay: float = Field(ge=0)


class AsapSchedule(_Strict):
    """One run as soon as possible."""

    asap: Literal[True]


class CronSchedule(_Strict):
    """Recurring runs from a cron expression evaluated on the wall clock of ``timezone``."""

    cron: str
    timezone: str = "UTC"
    on_ambiguous: Literal["first", "all"] = "first"
    on_nonexistent: Literal["shift", "skip"] = "shift"
    catch_up: Literal["replay", "coalesce", "skip"] = "coalesce"
    catch_up_window: float = Field(default=3600.0, gt=0)
    overlap: Literal["allow", "skip", "queue_one", "cancel_previous"] = "allow"


class IntervalSchedule(_Strict):
    """Recurring runs every ``interval`` seconds of elapsed time (immune to DST)."""

    interval: float = Field(gt=0)
    start: AwareDatetime | None = None
    catch_up: Literal["replay", "coalesce", "skip"] = "coalesce"
    catch_up_window: float = Field(default=3600.0, gt=0)
    overlap: Literal["allow", "skip", "queue_one", "cancel_previous"] = "allow"


ScheduleSpec = AtSchedule | DelaySchedule | AsapSchedule | CronSchedule | IntervalSchedule

_SCHEDULE_KEYS: dict[str, type[_Strict]] = {
    "at": AtSchedule,
    "delay": DelaySchedule,
    "asap": AsapSchedule,
    "cron": CronSchedule,
    "interval": IntervalSchedule,
}


def schedule_kind(spec: ScheduleSpec) -> str:
    """``at`` | ``delay`` | ``asap`` | ``cron`` | ``interval``."""
    for key, model in _SCHEDULE_KEYS.items():
        if isinstance(spec, model):
            return key
    raise TypeError(f"not a schedule: {spec!r}")


def _parse_schedule(value: Any) -> Any:
    """Pick the schedule model by its one distinguishing key, so errors name it."""
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


class RetryPolicy(_Strict):
    max_attempts: int = Field(default=3, ge=1, le=1000)
    initial_delay: float = Field(default=1.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1.0, le=100.0)
    max_delay: float = Field(default=300.0, ge=0)
    jitter: Literal["full", "equal", "none"] = "full"


class WebhookSpec(_Strict):
    url: HttpUrl
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)


class JobSpec(_Strict):
    """A job as submitted: its schedule and the template of each of its runs."""

    name: str = Field(min_length=1, max_length=200)
    schedule: Annotated[
        ScheduleSpec, Field(description="one of at / delay / asap / cron / interval")
    ]
    task: str | None = Field(default=None, min_length=1, max_length=200)
    webhook: WebhookSpec | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    pool: str = Field(default="default", min_length=1, max_length=100)
    requires: list[str] = Field(default_factory=list, max_length=50)
    tags: list[str] = Field(default_factory=list, max_length=50)
    priority: int = Field(default=2, ge=0, le=3)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout: float = Field(default=3600.0, gt=0, le=7 * 86400)
    heartbeat_timeout: float = Field(default=30.0, ge=1, le=3600)

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: Any) -> Any:
        return _parse_schedule(value)

    @model_validator(mode="after")
    def _one_target(self) -> JobSpec:
        if (self.task is None) == (self.webhook is None):
            raise ValueError("a job needs exactly one of 'task' or 'webhook'")
        return self

    @property
    def is_recurring(self) -> bool:
        return isinstance(self.schedule, CronSchedule | IntervalSchedule)


class TenantLimits(_Strict):
    """Per-tenant execution limits (enforced by admission control)."""

    max_concurrent_runs: int | None = Field(default=None, ge=1)
    max_dispatch_rate: float | None = Field(default=None, gt=0, description="runs per second")
    weight: float = Field(default=1.0, gt=0, le=1000)


def utc_iso(value: datetime) -> str:
    """An aware instant as ISO-8601 in UTC with ``Z``."""
    text = value.isoformat()
    return text.replace("+00:00", "Z")
