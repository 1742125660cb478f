"""Time engine: when a schedule is due. Pure functions, no I/O.

Every part of cronwheel that evaluates a schedule goes through this package.

Cron expressions have 5 fields (minute hour day-of-month month day-of-week) or 6
with a *leading* second field; lists, ranges, steps, month and weekday names and the
macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``. When both day
fields are restricted a day matches if either does (cron(5)). An expression has at
most ``MAX_CRON_LENGTH`` characters, a field at most as many list items as values, a
step from 1 to that number, and a range never wraps (``cron`` explains why). They are
evaluated on the wall clock of an IANA zone, and the wall times that occur twice or
not at all follow the schedule's policies:

- ``on_ambiguous="first"``: a wall time repeated by a fall-back fires once, at its
  earlier instant. ``"all"``: it fires at both; each run's local form carries its
  own offset (``2026-11-01T01:30:00-04:00``, then ``…-05:00``), so they are distinct.
- ``on_nonexistent="shift"``: a wall time skipped by a spring-forward fires once at
  the first instant after the gap, which is the transition instant itself
  (America/New_York, 2026-03-08: 02:30 fires at 03:00-04:00 = 07:00Z). Several
  skipped wall times of one gap collapse into that one firing, and if the expression
  also names the wall time at the end of the gap (03:00) it is still one firing.
  ``"skip"``: it does not fire; :func:`skipped_nonexistent` (or
  :func:`iter_occurrences` with ``include_skipped``) reports it with its reason.

Intervals are ``start + k * interval`` in elapsed time (the Unix epoch when there is
no ``start``), immune to DST. Every instant returned is aware UTC.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import islice
from typing import Literal, cast

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
    ScheduleSpec,
)
from cronwheel.timing.cron import CronExpr, parse_cron
from cronwheel.timing.cron_occurrences import (
    CompiledCron,
    Occurrence,
    OccurrenceKind,
    cron_next,
    iter_cron,
    skipped_in,
)
from cronwheel.timing.interval import CompiledInterval, compile_interval
from cronwheel.timing.zones import get_zone, local_form, to_aware, to_naive

__all__ = [
    "Compiled",
    "CompiledCron",
    "CompiledInterval",
    "CronExpr",
    "Occurrence",
    "OccurrenceKind",
    "compile_schedule",
    "due_local",
    "first_due",
    "iter_occurrences",
    "local_form",
    "next_after",
    "next_occurrence",
    "occurrences",
    "parse_cron",
    "skipped_nonexistent",
    "upcoming",
    "validate_schedule",
]

Compiled = CompiledCron | CompiledInterval  # what compile_schedule returns
_MICRO = timedelta(microseconds=1)


def _naive_utc(instant: datetime, name: str = "instant") -> datetime:
    if not isinstance(instant, datetime) or instant.tzinfo is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")
    return to_naive(instant)


def _policy(value: str, allowed: tuple[str, ...], field: str) -> str:
    if value not in allowed:
        raise InvalidScheduleError(
            f"{field.rsplit('.', 1)[-1]} must be one of {', '.join(allowed)}, not {value!r}",
            field=field,
        )
    return value


@lru_cache(maxsize=4096)
def _compile_cron(expr: str, tz: str, on_ambiguous: str, on_nonexistent: str) -> CompiledCron:
    return CompiledCron(
        expr=parse_cron(expr),
        zone=get_zone(tz),
        on_ambiguous=cast(
            Literal["first", "all"],
            _policy(on_ambiguous, ("first", "all"), "schedule.on_ambiguous"),
        ),
        on_nonexistent=cast(
            Literal["shift", "skip"],
            _policy(on_nonexistent, ("shift", "skip"), "schedule.on_nonexistent"),
        ),
    )


@lru_cache(maxsize=4096)
def _compile_interval(interval: float, start: datetime | None) -> CompiledInterval:
    # Constructed, not validated: the model has checked it, or a stored one is checked
    # by compile_interval itself.
    return compile_interval(IntervalSchedule.model_construct(interval=interval, start=start))


def compile_schedule(schedule: CronSchedule | IntervalSchedule | Compiled) -> Compiled:
    """The evaluable form of a recurring schedule (cached; compiled forms pass through).
    Raises :class:`InvalidScheduleError` naming the bad field."""
    if isinstance(schedule, CronSchedule):
        return _compile_cron(
            schedule.cron, schedule.timezone, schedule.on_ambiguous, schedule.on_nonexistent
        )
    if isinstance(schedule, IntervalSchedule):
        return _compile_interval(schedule.interval, schedule.start)
    if isinstance(schedule, CompiledCron | CompiledInterval):
        return schedule
    raise TypeError(f"not a recurring schedule: {schedule!r}")


def validate_schedule(schedule: ScheduleSpec) -> None:
    """Raise :class:`InvalidScheduleError` (with ``field``) unless the schedule can be
    evaluated: a cron expression that parses and can fire, a known zone, a usable
    interval. One-off schedules are checked by :func:`first_due`."""
    if isinstance(schedule, CronSchedule | IntervalSchedule):
        compile_schedule(schedule)


def next_after(
    schedule: CronSchedule | IntervalSchedule | Compiled, instant: datetime
) -> datetime | None:
    """The first due instant strictly after ``instant`` (aware UTC), honouring the DST
    policies; None when the schedule has no further occurrence."""
    compiled = compile_schedule(schedule)
    after = _naive_utc(instant)
    if isinstance(compiled, CompiledInterval):
        due = compiled.next_after(after)
    else:
        found = cron_next(compiled, after)
        due = None if found is None else found[0]
    return None if due is None else to_aware(due)


def _interval_occurrence(due: datetime) -> Occurrence:
    aware = to_aware(due)
    return Occurrence(aware, aware.isoformat(), "normal")


def next_occurrence(
    schedule: CronSchedule | IntervalSchedule | Compiled, instant: datetime
) -> Occurrence | None:
    """Like :func:`next_after`, with the local form, kind and reason of the run."""
    return next(iter_occurrences(schedule, instant + _MICRO), None)


def iter_occurrences(
    schedule: CronSchedule | IntervalSchedule | Compiled,
    start: datetime,
    end: datetime | None = None,
    *,
    include_skipped: bool = False,
) -> Iterator[Occurrence]:
    """Occurrences with ``start <= utc < end`` in order (no ``end``: without end).

    With ``include_skipped`` and ``on_nonexistent="skip"``, each skipped wall time comes
    as a ``skipped`` occurrence, before any run due at the same instant. An interval
    occurrence's ``local`` is its UTC form: no zone applies to it.
    """
    compiled = compile_schedule(schedule)
    low = _naive_utc(start, "start")
    high = None if end is None else _naive_utc(end, "end")
    if isinstance(compiled, CompiledCron):
        yield from iter_cron(compiled, low, high, include_skipped=include_skipped)
        return
    due = compiled.next_after(low - _MICRO)
    while due is not None and (high is None or due < high):
        yield _interval_occurrence(due)
        due = compiled.next_after(due)


def occurrences(
    expr: str,
    tz: str,
    start: datetime,
    end: datetime,
    *,
    on_ambiguous: str = "first",
    on_nonexistent: str = "shift",
    limit: int | None = None,
) -> list[datetime]:
    """The due instants of the cron expression ``expr`` on the wall clock of ``tz`` in
    ``[start, end)``, as aware UTC datetimes in order (at most ``limit`` of them)."""
    compiled = _compile_cron(expr, tz, on_ambiguous, on_nonexistent)
    cursor = _naive_utc(start, "start") - _MICRO
    high = _naive_utc(end, "end")
    found: list[datetime] = []
    while limit is None or len(found) < limit:
        nxt = cron_next(compiled, cursor)
        if nxt is None or nxt[0] >= high:
            break
        cursor = nxt[0]
        found.append(to_aware(cursor))
    return found


def skipped_nonexistent(expr: str, tz: str, start: datetime, end: datetime) -> list[Occurrence]:
    """The wall times ``expr`` names that do not exist in ``tz`` (spring-forward gaps
    whose transition instant is in ``[start, end)``), each a ``skipped`` occurrence
    whose ``utc`` is that transition and whose ``reason`` says what happened. This is
    what ``on_nonexistent="skip"`` leaves out and ``"shift"`` moves."""
    compiled = _compile_cron(expr, tz, "first", "skip")
    return list(skipped_in(compiled, _naive_utc(start, "start"), _naive_utc(end, "end")))


def upcoming(
    schedule: CronSchedule | IntervalSchedule | Compiled, now: datetime, count: int
) -> list[Occurrence]:
    """The next ``count`` occurrences at or after ``now`` (a schedule preview)."""
    return list(islice(iter_occurrences(schedule, now), max(count, 0)))


def due_local(schedule: ScheduleSpec, instant: datetime) -> str | None:
    """The local form of a due ``instant`` for a run of ``schedule``: the wall time with
    its own offset for cron, the user's own offset for ``at``; None where no zone
    applies (delay, asap, interval)."""
    if isinstance(schedule, CronSchedule):
        return local_form(instant, schedule.timezone)
    if isinstance(schedule, AtSchedule):
        offset = schedule.at.tzinfo
        return instant.astimezone(offset).isoformat()
    return None


def first_due(
    schedule: ScheduleSpec,
    now: datetime,
    *,
    max_horizon: timedelta,
    past_grace: timedelta,
) -> datetime:
    """The instant a new job's first run is due, in UTC.

    ``at`` more than ``past_grace`` in the past, or anything beyond ``now + max_horizon``,
    is rejected with :class:`InvalidScheduleError` naming the field. A recurring
    schedule's first run is its first occurrence at or after ``now``.
    """
    if isinstance(schedule, AtSchedule):
        due = schedule.at.astimezone(UTC)
        if due < now - past_grace:
            raise InvalidScheduleError(
                f"'at' {due.isoformat()} is in the past (more than "
                f"{past_grace.total_seconds():.0f} s before now)",
                field="schedule.at",
            )
        field = "schedule.at"
    elif isinstance(schedule, DelaySchedule):
        due = now + timedelta(seconds=schedule.delay)
        field = "schedule.delay"
    elif isinstance(schedule, AsapSchedule):
        return now
    elif isinstance(schedule, CronSchedule | IntervalSchedule):
        if isinstance(schedule, CronSchedule):
            field = "schedule.cron"
        else:
            field = "schedule.interval" if schedule.start is None else "schedule.start"
        nxt = next_after(schedule, now - _MICRO)
        if nxt is None:
            raise InvalidScheduleError(
                f"the schedule has no occurrence after {now.isoformat()}", field=field
            )
        due = nxt
    else:  # pragma: no cover - the union is exhaustive
        raise InvalidScheduleError("unknown schedule", field="schedule")
    if due > now + max_horizon:
        raise InvalidScheduleError(
            f"the first run would be due {due.isoformat()}, beyond the horizon of "
            f"{max_horizon.days} days",
            field=field,
        )
    return due  # an instant a little in the past fires at once, its lateness recorded
