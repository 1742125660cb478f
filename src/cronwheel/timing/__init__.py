"""Time engine: when a schedule is due. Pure functions, no I/O.

Every part of cronwheel that evaluates a schedule goes through this package.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
    ScheduleSpec,
)

__all__ = ["first_due"]


def first_due(
    schedule: ScheduleSpec,
    now: datetime,
    *,
    max_horizon: timedelta,
    past_grace: timedelta,
) -> datetime:
    """The instant a new job's first run is due, in UTC.

    ``at`` more than ``past_grace`` in the past, or anything beyond ``now + max_horizon``,
    is rejected with :class:`InvalidScheduleError` naming the field.
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
        raise InvalidScheduleError(
            "recurring schedules (cron, interval) are not available in this version",
            field="schedule",
        )
    else:  # pragma: no cover - the union is exhaustive
        raise InvalidScheduleError("unknown schedule", field="schedule")
    if due > now + max_horizon:
        raise InvalidScheduleError(
            f"the first run would be due {due.isoformat()}, beyond the horizon of "
            f"{max_horizon.days} days",
            field=field,
        )
    return due  # an instant a little in the past fires at once, its lateness recorded
