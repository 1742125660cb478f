"""Making a job: the one path from a validated spec to what the store creates.

The API (single and batch creation), the benchmarks and tools that load jobs all call
:func:`new_job`: it checks what the spec's model cannot (the payload's size, the
schedule against the clock), resolves the first due instant on the clock it is given,
and lists the occurrences a DST gap skips before it, so the store writes the job, its
first run and those skipped occurrences in one transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import PayloadTooLargeError
from cronwheel.domain.model import NewJob, SkippedOccurrence
from cronwheel.domain.spec import CronSchedule, JobSpec
from cronwheel.timing import due_local, first_due
from cronwheel.timing.catchup import skipped_before_first
from cronwheel.timing.spread import check_spread

__all__ = ["JobLimits", "check_json_size", "json_size_over", "new_job"]


@dataclass(frozen=True, slots=True)
class JobLimits:
    """What a deployment allows of a new job (``Settings`` holds the figures)."""

    max_payload_bytes: int = 64 * 1024
    max_horizon: timedelta = timedelta(days=3 * 366)  # how far ahead a first run may be
    past_grace: timedelta = timedelta(0)  # how far in the past an ``at`` may be


# One encoder for every check: ``json.dumps`` with options builds a new one per call,
# which costs more than encoding a small payload.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# What ``json`` cannot write, orjson refuses too (the exact measure then raises).
_PASSTHROUGH = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def check_json_size(value: Any, *, limit: int, field: str) -> None:
    """Reject ``value`` when its compact JSON form exceeds ``limit`` bytes."""
    size = json_size_over(value, limit)
    if size is not None:
        raise PayloadTooLargeError(
            f"{field} is {size} bytes of JSON; the limit is {limit}", field=field
        )


def json_size_over(value: Any, limit: int) -> int | None:
    """The size of ``value``'s compact JSON form in bytes when it exceeds ``limit``;
    None when it does not."""
    try:
        # orjson writes the same bytes but for a float's exponent (``1e-7``, one
        # character shorter than ``1e-07``), four times faster: a value of at most
        # half the limit by it is within the limit whatever its floats.
        if len(orjson.dumps(value, option=_PASSTHROUGH)) * 2 <= limit:
            return None
    except (orjson.JSONEncodeError, TypeError):
        pass  # an integer past 64 bits, a key that is not text: measured below
    size = len(_COMPACT.encode(value).encode())
    return size if size > limit else None


def new_job(
    spec: JobSpec,
    *,
    now: datetime,
    limits: JobLimits,
    actor: Actor | None = None,
    idempotency_key: str | None = None,
) -> NewJob:
    """The job to create from ``spec`` at ``now`` (the database clock's instant)."""
    check_json_size(spec.payload, limit=limits.max_payload_bytes, field="payload")
    due = first_due(
        spec.schedule, now, max_horizon=limits.max_horizon, past_grace=limits.past_grace
    )
    check_spread(spec)
    skipped: tuple[SkippedOccurrence, ...] = ()
    if isinstance(spec.schedule, CronSchedule) and spec.schedule.on_nonexistent == "skip":
        skipped = tuple(
            SkippedOccurrence(p.due_at, p.due_local, p.reason or "skipped")
            for p in skipped_before_first(spec.schedule, now)
        )
    return NewJob(
        spec=spec,
        first_due_at=due,
        idempotency_key=idempotency_key,
        actor=actor,
        due_local=due_local(spec.schedule, due),
        skipped=skipped,
    )
