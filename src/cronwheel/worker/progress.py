"""Progress reports on the worker's side. A handler calls ``ctx.heartbeat(details)`` —
on the event loop or from its thread — and the report waits here; the heartbeat loop
takes the last one of each attempt and carries it with its next batched beat, so a
report never costs a request of its own::

    handler ──ctx.heartbeat(d)──▶ UnsentProgress ──take()──▶ next beat (one request for
       (any thread; the last one wins)      ▲                 every held attempt)
                                            └──restore()── the beat failed: sent next time
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from cronwheel.domain.bounds import check_json_tree
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.progress import (
    PROGRESS_DETAILS_DEPTH_MAX,
    PROGRESS_DETAILS_MAX_BYTES,
    details_size,
)
from cronwheel.worker.protocol import Heartbeat, Lease

__all__ = ["ProgressReport", "UnsentProgress", "heartbeats"]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    details: Any  # JSON-ready


class UnsentProgress:
    """The last progress report of one attempt that no beat has carried yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # handlers in threads report while the loop takes
        self._report: ProgressReport | None = None

    def put(self, details: Any) -> None:
        """Keep a report, replacing an unsent one. Details that are not JSON, that the
        server would refuse (NaN, a NUL, nested too deep) or that take more than
        :data:`PROGRESS_DETAILS_MAX_BYTES` as JSON raise at once (TypeError,
        ValueError), so the handler's author sees it where it happens — and a refused
        batch never costs the worker its other attempts' beats."""
        try:
            value = to_jsonable_python(details)
        except PydanticSerializationError as exc:
            raise TypeError(f"progress details must be JSON-serialisable: {exc}") from None
        try:
            check_json_tree(value, max_depth=PROGRESS_DETAILS_DEPTH_MAX, prefix="details")
        except ValidationError as exc:
            raise ValueError(f"progress details cannot be sent: {exc.message}") from None
        size = details_size(value)
        if size > PROGRESS_DETAILS_MAX_BYTES:
            raise ValueError(
                f"progress details take {size} bytes of JSON; "
                f"the limit is {PROGRESS_DETAILS_MAX_BYTES}"
            )
        with self._lock:
            self._report = ProgressReport(value)

    def take(self) -> ProgressReport | None:
        with self._lock:
            report, self._report = self._report, None
        return report

    def restore(self, report: ProgressReport) -> None:
        """Put back a report whose beat failed, unless a newer one came meanwhile."""
        with self._lock:
            if self._report is None:
                self._report = report


def heartbeats(
    held: Iterable[tuple[Lease, UnsentProgress]],
) -> tuple[list[Heartbeat], list[tuple[UnsentProgress, ProgressReport]]]:
    """One beat per held attempt, each carrying its unsent report, and the reports taken
    (to restore when the beat fails). A lease from a server that predates progress
    reports gets plain beats: such a server would refuse the whole batch."""
    beats: list[Heartbeat] = []
    taken: list[tuple[UnsentProgress, ProgressReport]] = []
    for lease, unsent in held:
        report = unsent.take() if lease.takes_progress else None
        if report is None:
            beats.append(Heartbeat(lease.attempt_id, lease.fencing_token))
            continue
        beats.append(Heartbeat(lease.attempt_id, lease.fencing_token, True, report.details))
        taken.append((unsent, report))
    return beats, taken
