"""Is a recurring job's schedule stalled? (docs/alerts.md)

A recurring job keeps one run ahead of it: its latest scheduled run is SCHEDULED until
it fires, and firing it creates the next. When the latest is no longer SCHEDULED (it
fired, was quarantined, cancelled, deleted by hand) nothing is left to fire the job's
next occurrence; once that occurrence (with the job's spread) is past the lateness
budget, the schedule is stalled. A job no longer active, or whose schedule has no
further occurrence, is not.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cronwheel.domain.model import ScheduleProbe
from cronwheel.domain.spec import LATENESS_BUDGET_DEFAULT, CronSchedule, IntervalSchedule
from cronwheel.domain.states import JobState, RunState
from cronwheel.timing import next_after

__all__ = ["stall_reason"]

_MICRO = timedelta(microseconds=1)


def stall_reason(probe: ScheduleProbe, now: datetime) -> str | None:
    """Why ``probe``'s schedule is stalled at ``now``, or None when it is not. Raises
    when the job's stored schedule cannot be evaluated (the caller isolates the job)."""
    if probe.state != JobState.ACTIVE.value or probe.kind not in ("cron", "interval"):
        return None
    if probe.latest_state == RunState.SCHEDULED.value:
        return None  # a run is there to fire it (late or not: missed runs say so)
    schedule = (
        CronSchedule.model_validate(probe.schedule)
        if probe.kind == "cron"
        else IntervalSchedule.model_validate(probe.schedule)
    )
    after = probe.latest_due_at if probe.latest_due_at is not None else probe.created_at - _MICRO
    due = next_after(schedule, after)
    if due is None:
        return None
    budget = probe.lateness_budget or LATENESS_BUDGET_DEFAULT
    if due + timedelta(seconds=probe.spread + budget) >= now:
        return None
    since = "no run ever" if probe.latest_due_at is None else "no run after the one due"
    last = "" if probe.latest_due_at is None else f" {probe.latest_due_at.isoformat()}"
    return (
        f"the occurrence due {due.isoformat()} has no run ({since}{last}), "
        f"past its lateness budget of {budget:g} s"
    )
