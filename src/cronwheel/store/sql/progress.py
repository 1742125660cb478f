"""Progress reports on the store's side (both backends): recording them as they ride on
heartbeats, and the progress deadline the expiry sweep checks.

An attempt of a run with a ``progress_timeout`` starts with ``progress_deadline`` = its
start plus that timeout; each progress report moves it to the report's arrival plus the
timeout. The expiry sweep finds attempts past it through the partial index
``ix_attempts_progress`` (live attempts with a progress deadline only), so attempts
without one cost the sweep nothing::

    RUNNING ──report──▶ RUNNING (progress_deadline = now + progress_timeout)
       │
       └── progress_deadline passed ──▶ TIMED_OUT "no progress reported for N s …"
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cronwheel.domain.progress import no_progress_error
from cronwheel.store.schema import attempts
from cronwheel.store.values import HeartbeatItem

__all__ = ["last_reports", "progress_deadline", "progress_overdue", "progress_rows", "stalled"]


def progress_deadline(start: datetime, progress_timeout: float | None) -> datetime | None:
    """The progress deadline of an attempt started (or last reporting) at ``start``."""
    if progress_timeout is None:
        return None
    return start + timedelta(seconds=progress_timeout)


def last_reports(items: Sequence[HeartbeatItem]) -> list[HeartbeatItem]:
    """The progress reports among ``items``, one per (attempt, token) pair: the last."""
    last: dict[tuple[uuid.UUID, int], HeartbeatItem] = {}
    for item in items:
        if item.progress:
            last[item.attempt_id, item.fencing_token] = item
    return list(last.values())


def progress_rows(
    items: Sequence[HeartbeatItem],
    timeouts: Mapping[tuple[uuid.UUID, int], float | None],
    at: datetime,
) -> list[dict[str, Any]]:
    """Per-row values (for ``update_each``) recording at ``at`` the reports among
    ``items`` whose (attempt, token) is in ``timeouts`` — the beats applied, each mapped
    to its run's progress timeout; a report under a stale token is not one of them."""
    return [
        {
            "id": item.attempt_id,
            "progress_at": at,
            "progress_details": item.details,
            "progress_deadline": progress_deadline(at, timeouts[key]),
        }
        for item in last_reports(items)
        if (key := (item.attempt_id, item.fencing_token)) in timeouts
    ]


def progress_overdue(at: datetime | sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """Attempts past their progress deadline at ``at``. The comparison implies the
    index's ``progress_deadline IS NOT NULL``, so both dialects may use it."""
    return attempts.c.progress_deadline < at


def stalled(row: Any, at: datetime) -> str | None:
    """The error of an attempt ``row`` (with ``progress_deadline``, ``progress_at`` and
    ``started_at``) that is past its progress deadline at ``at``, else None. The
    timeout is read back from the deadline and what set it (the last report, or the
    start), so the sweep needs no join with the run."""
    if row.progress_deadline is None or row.progress_deadline >= at:
        return None
    since = row.progress_at or row.started_at
    return no_progress_error((row.progress_deadline - since).total_seconds())
