"""Spread: each run of a job fires at a deterministic offset after its due instant.

A job with ``spread`` S keeps its occurrences (``due_at``, the nominal instant, which
stays the run's identity: one run per job and ``due_at``) and fires each at its
*spread instant* ``fire_at = due_at + offset``, the offset in ``[0, S)``::

    due_at ──────────────┬────────────────────── due_at + S
                         fire_at = due_at + offset(job id, due_at)

The offset depends only on the job's id and the occurrence, so every node, every
restart and every backend computes the same one:

    n         = the first 32 bits of md5("<job id>:<due_at in epoch microseconds>")
    offset_us = floor(n * S_us / 2**32)        S_us = S in whole microseconds

``n`` is uniform, so a thousand jobs on one schedule fire spread evenly over the window.
The PostgreSQL driver computes the same expression inside its next-occurrence statement
(``store/drivers/postgres_firing.py``); a test holds the two to each other.

A recurring job's spread must be shorter than its schedule's shortest interval, so
that spread instants keep the occurrences' order: :func:`check_spread`. For an interval
schedule that is the interval. For cron it is the shortest gap the expression's second,
minute and hour fields allow between two wall times, counting the gap from a day's last
time to the next day's first even when the day fields rule out consecutive days (a
bound that errs on the side of refusing). A DST change can still bring two wall times
closer (``on_ambiguous="all"``); catch-up (``timing.catchup``) copes with spread
instants out of order.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import pairwise

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.spec import CronSchedule, IntervalSchedule, JobSpec
from cronwheel.timing.cron import parse_cron

__all__ = [
    "check_spread",
    "shortest_gap",
    "spread_instant",
    "spread_offset_us",
    "spread_us",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_DAY_S = 86400


def spread_us(spread: float) -> int:
    """A spread in whole microseconds (specs hold whole milliseconds, so this is exact)."""
    return round(spread * 1_000_000)


def spread_offset_us(job_id: uuid.UUID, due_at: datetime, spread: float) -> int:
    """The offset of the run of ``job_id`` due at ``due_at``, in microseconds, in
    ``[0, spread)`` (0 when ``spread`` is 0)."""
    width = spread_us(spread)
    if width <= 0:
        return 0
    epoch_us = (due_at - _EPOCH) // _MICRO
    digest = hashlib.md5(f"{job_id}:{epoch_us}".encode(), usedforsecurity=False).hexdigest()
    return (int(digest[:8], 16) * width) >> 32


def spread_instant(job_id: uuid.UUID, due_at: datetime, spread: float) -> datetime:
    """When the run of ``job_id`` due at ``due_at`` fires: its spread instant."""
    if spread <= 0:
        return due_at
    return due_at + timedelta(microseconds=spread_offset_us(job_id, due_at, spread))


@lru_cache(maxsize=1024)
def _cron_gap(expr: str) -> float:
    parsed = parse_cron(expr)
    times = sorted(
        h * 3600 + m * 60 + s for h in parsed.hours for m in parsed.minutes for s in parsed.seconds
    )
    gap = _DAY_S - times[-1] + times[0]  # from the last time of a day to the next day's first
    for a, b in pairwise(times):
        gap = min(gap, b - a)
    return float(gap)


def shortest_gap(schedule: CronSchedule | IntervalSchedule) -> float:
    """The shortest interval, in seconds, between two occurrences of ``schedule`` (for
    cron, the bound the module docstring describes)."""
    if isinstance(schedule, IntervalSchedule):
        return schedule.interval
    return _cron_gap(schedule.cron)


def check_spread(spec: JobSpec) -> None:
    """Refuse (422, field ``spread``) a recurring job's spread that is not shorter than
    its schedule's shortest interval. The schedule itself must already be valid."""
    if spec.spread <= 0 or not isinstance(spec.schedule, CronSchedule | IntervalSchedule):
        return
    gap = shortest_gap(spec.schedule)
    if spec.spread >= gap:
        raise ValidationError(
            f"spread {spec.spread:g} s is not shorter than the schedule's shortest interval "
            f"({gap:g} s): runs would fire out of order",
            field="spread",
        )
