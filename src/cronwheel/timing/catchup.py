"""What firing one scheduled run of a recurring job does: catch-up after downtime or a
pause, overlap with a run still going, and the next occurrence to materialise. Pure:
the store applies the plan in the firing transaction.

A run is *missed* when it fires more than ``MISFIRE_GRACE`` after its due instant (the
scheduler was down, the job paused, or the run queued behind an earlier one). Then the
job's ``catch_up`` policy decides, for it and for every occurrence that fell due since
(those were never materialised: only the next occurrence ever is):

- ``replay``: each one within ``catch_up_window`` runs, oldest first; older ones are
  recorded SKIPPED with the reason.
- ``coalesce`` (the default): one run stands for them all and records how many.
- ``skip``: none runs; each is recorded SKIPPED with the reason.

With a spread (``timing.spread``) every rule above reads the occurrence's *spread
instant* — when its run fires — instead of its due instant: lateness, the grace, the
catch-up window, and which occurrences are missed (those whose spread instant has
passed). An occurrence due before ``now`` whose spread instant is still ahead is not
missed: it becomes the next run, and fires at its spread instant.

Wall times a spring-forward gap removes under ``on_nonexistent="skip"`` are recorded
SKIPPED too. They have no instant of their own, so each is filed a few microseconds
before the end of its gap (as many as the seconds from it to the gap's end), which keeps
them distinct, ordered, and the same every time they are computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from cronwheel.domain.spec import CronSchedule, IntervalSchedule
from cronwheel.timing import iter_occurrences
from cronwheel.timing.cron_occurrences import Occurrence

__all__ = [
    "MAX_CATCH_UP",
    "MAX_COUNTED",
    "MISFIRE_GRACE",
    "FirePlan",
    "RunToCreate",
    "plan_fire",
    "skipped_before_first",
    "skipped_instant",
]

MISFIRE_GRACE = timedelta(seconds=60)
MAX_CATCH_UP = 1000  # missed occurrences handled one by one; older ones are counted
MAX_COUNTED = 100_000  # beyond this, a very long outage is reported as "N+"

_Recurring = CronSchedule | IntervalSchedule
_RunFate = Literal["SCHEDULED", "DISPATCHED", "SKIPPED"]


@dataclass(frozen=True, slots=True)
class RunToCreate:
    """A run to create for the job."""

    due_at: datetime
    due_local: str | None
    state: _RunFate
    origin: Literal["schedule", "replay"]
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What to do with the run being fired, and the runs to create beside it."""

    fate: Literal["DISPATCHED", "SKIPPED", "WAIT"]
    reason: str | None = None  # recorded on the run (why it was skipped, coalesced, late)
    cancel_previous: bool = False
    created: list[RunToCreate] = field(default_factory=list)
    next_due_at: datetime | None = None  # the job's next scheduled instant


def skipped_instant(occurrence: Occurrence, timezone: str) -> datetime:
    """Where a skipped wall time is filed: before its gap's end by as many microseconds
    as there are seconds from it to that end (see the module docstring)."""
    nominal = datetime.fromisoformat(occurrence.local).replace(tzinfo=None)
    gap_end = occurrence.utc.astimezone(ZoneInfo(timezone)).replace(tzinfo=None)
    seconds = max(1, int((gap_end - nominal).total_seconds()))
    return occurrence.utc - timedelta(microseconds=seconds)


def plan_fire(
    schedule: _Recurring,
    *,
    due_at: datetime,
    now: datetime,
    busy: bool,
    waiting: bool,
    spread_at: Callable[[datetime], datetime] | None = None,
) -> FirePlan:
    """Plan the firing at ``now`` of the scheduled run due at ``due_at``.

    ``busy``: another run of the job is DISPATCHED or RUNNING. ``waiting``: another
    scheduled run of the job already waits for it (``queue_one``). ``spread_at``: the
    spread instant of an occurrence due at a given instant (none: no spread).
    """
    fires = spread_at or _unspread
    created: list[RunToCreate] = []
    late = now - fires(due_at)
    overlap = schedule.overlap

    if busy and overlap == "skip":
        return _with_next(
            FirePlan("SKIPPED", "the previous run is still going (overlap=skip)"),
            schedule,
            due_at,
            now,
        )
    if busy and overlap == "queue_one":
        if waiting:
            return _with_next(
                FirePlan(
                    "SKIPPED",
                    "a run is already queued behind the one still going (overlap=queue_one)",
                ),
                schedule,
                due_at,
                now,
            )
        return FirePlan("WAIT", "queued behind the run still going (overlap=queue_one)")

    if late <= MISFIRE_GRACE:
        plan = FirePlan("DISPATCHED", cancel_previous=busy and overlap == "cancel_previous")
        return _with_next(plan, schedule, due_at, now)

    # Missed: this run and every occurrence since whose spread instant has passed. The
    # most recent MAX_CATCH_UP are handled one by one; older ones are counted in the
    # reason. The first occurrence still ahead of its spread instant is the next run.
    zone = schedule.timezone if isinstance(schedule, CronSchedule) else "UTC"
    recent: deque[Occurrence] = deque(maxlen=MAX_CATCH_UP)
    total = 0
    ahead: Occurrence | None = None
    for o in iter_occurrences(schedule, due_at + _MICRO, now + _MICRO, include_skipped=True):
        if o.kind == "skipped":  # a wall time a DST gap removed: recorded, never run
            created.append(
                RunToCreate(skipped_instant(o, zone), o.local, "SKIPPED", "schedule", o.reason)
            )
            continue
        if fires(o.utc) > now:
            ahead = o
            break
        recent.append(o)
        total += 1
        if total >= MAX_COUNTED:
            break
    missed = list(recent)
    older = total - len(missed)
    more = "" if older <= 0 else f"; {older}{'+' if total >= MAX_COUNTED else ''} older not listed"
    window = timedelta(seconds=schedule.catch_up_window)
    policy = schedule.catch_up
    late_s = f"{late.total_seconds():.0f} s"
    cancel = busy and overlap == "cancel_previous"
    if policy == "skip":
        reason = f"missed by {late_s} (catch_up=skip)"
        created += [RunToCreate(o.utc, o.local, "SKIPPED", "schedule", reason) for o in missed]
        plan = FirePlan("SKIPPED", reason + more, created=created)
    elif policy == "coalesce":
        count = total + 1
        reason = (
            f"late by {late_s}: stands for {count}{'+' if total >= MAX_COUNTED else ''} "
            f"missed occurrence{'s' if count != 1 else ''} (catch_up=coalesce)"
        )
        plan = FirePlan("DISPATCHED", reason, cancel_previous=cancel, created=created)
    else:
        outside = "outside the catch-up window (catch_up=replay)"
        for o in missed:
            if now - fires(o.utc) <= window:
                created.append(
                    RunToCreate(
                        o.utc,
                        o.local,
                        "DISPATCHED",
                        "replay",
                        "replayed after being missed (catch_up=replay)",
                    )
                )
            else:
                created.append(RunToCreate(o.utc, o.local, "SKIPPED", "schedule", outside))
        if late <= window:
            plan = FirePlan(
                "DISPATCHED",
                f"replayed {late_s} late (catch_up=replay){more}",
                cancel_previous=cancel,
                created=created,
            )
        else:
            plan = FirePlan("SKIPPED", outside + more, created=created)
    if ahead is not None:  # due already, its spread instant still to come
        created = [*plan.created, RunToCreate(ahead.utc, ahead.local, "SCHEDULED", "schedule")]
        return FirePlan(plan.fate, plan.reason, plan.cancel_previous, created, ahead.utc)
    # Everything up to now is accounted for: the next occurrence is the first after it.
    return _with_next(plan, schedule, now, now)


_MICRO = timedelta(microseconds=1)


def _unspread(due_at: datetime) -> datetime:
    return due_at


def skipped_before_first(schedule: _Recurring, now: datetime) -> list[RunToCreate]:
    """The wall times a new job skips before its first occurrence at or after ``now``
    (gaps under ``on_nonexistent="skip"``), to record SKIPPED when it is created."""
    plan = _with_next(FirePlan("DISPATCHED"), schedule, now - _MICRO, now)
    return [p for p in plan.created if p.state == "SKIPPED"]


def _with_next(plan: FirePlan, schedule: _Recurring, after: datetime, now: datetime) -> FirePlan:
    """Add the next occurrence strictly after ``after``, and the wall times skipped on
    the way to it."""
    created = list(plan.created)
    next_due: datetime | None = None
    zone = schedule.timezone if isinstance(schedule, CronSchedule) else "UTC"
    for occurrence in iter_occurrences(schedule, after + _MICRO, include_skipped=True):
        if occurrence.kind == "skipped":
            created.append(
                RunToCreate(
                    skipped_instant(occurrence, zone),
                    occurrence.local,
                    "SKIPPED",
                    "schedule",
                    occurrence.reason,
                )
            )
            continue
        created.append(RunToCreate(occurrence.utc, occurrence.local, "SCHEDULED", "schedule"))
        next_due = occurrence.utc
        break
    return FirePlan(plan.fate, plan.reason, plan.cancel_previous, created, next_due)
