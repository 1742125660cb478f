"""The due window: the runs a scheduler node will fire soon, in memory.

::

      database (SCHEDULED runs, index on (shard, fire_at))
         │  refill: range scan fire_at < horizon           ▲ months-away runs stay here:
         ▼                                                  │ one row, one index entry
    ┌──────────────────────────────┐   pop_due(now)   ┌─────┴─────┐
    │ heap of (fire_at, run id)    │ ───────────────▶ │  fire     │ one UPDATE per batch
    │ ids already held (dedupe)    │                  └───────────┘
    └──────────────────────────────┘
         ▲  push: runs created or retried inside the window (notifications)

Invariants:

- ``horizon`` is the instant up to which the window holds *every* SCHEDULED run of the
  node's shards (as of the last refill, plus every notification since). Runs due later
  are not in memory; a refill extends the horizon before it is reached.
- A run id is in the heap at most once. Entries are hints: firing re-checks the state in
  the database, so a run cancelled meanwhile is simply not fired.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable
from datetime import datetime

from cronwheel.domain.model import DueRun

__all__ = ["DueWindow"]


class DueWindow:
    def __init__(self) -> None:
        self._heap: list[tuple[datetime, uuid.UUID, int]] = []
        self._ids: set[uuid.UUID] = set()
        self.horizon: datetime | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, runs: Iterable[DueRun]) -> int:
        """Add runs not yet held; returns how many were new."""
        added = 0
        for run in runs:
            if run.id in self._ids:
                continue
            self._ids.add(run.id)
            heapq.heappush(self._heap, (run.fire_at, run.id, run.shard))
            added += 1
        return added

    def next_fire_at(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime, limit: int | None = None) -> list[DueRun]:
        """Remove and return the runs due at ``now``, soonest first."""
        out: list[DueRun] = []
        while self._heap and self._heap[0][0] <= now and (limit is None or len(out) < limit):
            fire_at, run_id, shard = heapq.heappop(self._heap)
            self._ids.discard(run_id)
            out.append(DueRun(id=run_id, shard=shard, fire_at=fire_at))
        return out

    def drop_shards(self, shards: set[int]) -> None:
        """Forget the runs of shards this node no longer owns."""
        if not shards:
            return
        kept = [entry for entry in self._heap if entry[2] not in shards]
        self._ids = {entry[1] for entry in kept}
        heapq.heapify(kept)
        self._heap = kept
