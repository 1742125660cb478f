"""The due window: the runs a scheduler node will fire soon, in memory.

::

      database (SCHEDULED runs, index on (shard, fire_at))
         │  refill: range scan fire_at < horizon           ▲ months-away runs stay here:
         ▼                                                  │ one row, one index entry
    ┌──────────────────────────────┐   pop_due(now)   ┌─────┴─────┐
    │ heap of instants, runs by    │ ───────────────▶ │  fire     │ one UPDATE per batch
    │ instant, heap of bursts      │                  └───────────┘
    │ ids already held (dedupe)    │
    └──────────────────────────────┘
         ▲  push: runs created or retried inside the window (notifications)

Invariants:

- ``horizon`` is the instant up to which the window holds *every* SCHEDULED run of the
  node's shards (as of the last refill, plus every notification since). Runs due later
  are not in memory; a refill extends the horizon before it is reached.
- A run id is in the window at most once, at the last fire time pushed for it: a run
  pushed again at another instant (its job edited: announced with its new fire time,
  or read so by a poll) moves there. Entries are hints: firing re-checks the state and
  the fire time in the database, so a run cancelled or moved later meanwhile is simply
  not fired.
- Runs are kept by instant. An instant with at least ``burst`` runs (a top-of-the-hour
  spike; by default any run) is also on the burst heap, and is handed out ``lead``
  early: dispatched ahead, its runs can be reserved by workers before it comes.
- A run pushed ``at_instant`` (the store would not fire it ahead: its job guards
  against overlap, which is judged at the instant) counts toward no burst and is
  handed out at its instant only, whatever else is due then.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from cronwheel.domain.model import DueRun

__all__ = ["DueWindow"]

# Notices carry fire times in whole milliseconds, scans exact ones: a run held at a fire
# time this close to the one pushed again is held where it is.
_NOTICE_PRECISION = timedelta(milliseconds=1)


class DueWindow:
    """``burst``: an instant with at least this many runs is a *burst*, and
    :meth:`pop_due` hands its runs out up to ``lead`` seconds early (see
    ``Settings.dispatch_lead``); other runs go at their instant."""

    def __init__(self, *, burst: int = 1) -> None:
        self.burst = max(1, burst)
        self._instants: list[datetime] = []  # heap of instants with runs held
        self._runs: dict[datetime, list[tuple[uuid.UUID, int]]] = {}  # instant -> runs
        self._bursts: list[datetime] = []  # heap of instants that reached ``burst`` runs
        self._ahead: dict[datetime, int] = {}  # instant -> its runs that may go ahead
        self._held: dict[uuid.UUID, datetime] = {}  # run -> the instant it is held at
        self._at_instant: set[uuid.UUID] = set()  # held runs that go at their instant only
        self.horizon: datetime | None = None
        # When the last refill stopped at its limit inside one instant (a burst larger
        # than the limit): the last run it read there, where the next refill goes on.
        self.horizon_id: uuid.UUID | None = None

    def __len__(self) -> int:
        return len(self._held)

    def push(self, runs: Iterable[DueRun], *, at_instant: bool = False) -> int:
        """Add runs not yet held (``at_instant``: never to be handed out ahead), and move
        those held at another instant to theirs; returns how many were new."""
        added = 0
        for run in runs:
            held_at = self._held.get(run.id)
            if held_at is not None and abs(held_at - run.fire_at) < _NOTICE_PRECISION:
                continue
            if held_at is not None:
                self._unhold(run.id, held_at)
            else:
                added += 1
            self._held[run.id] = run.fire_at
            at = self._runs.get(run.fire_at)
            if at is None:
                at = self._runs[run.fire_at] = []
                heapq.heappush(self._instants, run.fire_at)
            at.append((run.id, run.shard))
            if at_instant:
                self._at_instant.add(run.id)
                continue
            ahead = self._ahead[run.fire_at] = self._ahead.get(run.fire_at, 0) + 1
            if ahead == self.burst:
                heapq.heappush(self._bursts, run.fire_at)
        return added

    def _unhold(self, run_id: uuid.UUID, at: datetime) -> None:
        """Take a held run off its instant (to hold it at another). An instant left
        with fewer runs than a burst stays on the burst heap: it goes ahead all the
        same, which firing allows."""
        held = [r for r in self._runs.get(at, []) if r[0] != run_id]
        if held:
            self._runs[at] = held
        else:
            self._runs.pop(at, None)
            self._ahead.pop(at, None)
        if run_id in self._at_instant:
            self._at_instant.discard(run_id)
        elif held and at in self._ahead:
            self._ahead[at] -= 1

    def _top(self, heap: list[datetime]) -> datetime | None:
        """The earliest instant of ``heap`` still holding runs (others are dropped)."""
        while heap and heap[0] not in self._runs:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def next_fire_at(self, lead: timedelta = timedelta(0)) -> datetime | None:
        """When :meth:`pop_due` next has something: the earliest instant, or a burst's
        instant less ``lead`` if that comes first."""
        first = self._top(self._instants)
        burst = self._top(self._bursts)
        if burst is not None and (first is None or burst - lead < first):
            return burst - lead
        return first

    def pop_due(
        self, now: datetime, lead: timedelta = timedelta(0), gather: timedelta = timedelta(0)
    ) -> list[DueRun]:
        """Remove and return the runs due at ``now``, and those of bursts due by
        ``now + lead`` — with them, once one is, those of bursts due up to ``gather``
        later (dispatched together, a little further ahead) — soonest first."""
        out: list[DueRun] = []
        first = self._top(self._bursts)
        until = now + lead + (gather if first is not None and first <= now + lead else timedelta(0))
        while (burst := self._top(self._bursts)) is not None and burst <= until:
            self._take(heapq.heappop(self._bursts), out, ahead=True)
        while (first := self._top(self._instants)) is not None and first <= now:
            self._take(heapq.heappop(self._instants), out)
        out.sort(key=lambda r: r.fire_at)
        return out

    def _take(self, at: datetime, out: list[DueRun], *, ahead: bool = False) -> None:
        """The runs held at ``at`` — ``ahead``: those that may go before it; the others
        stay, the instant still on the heap of instants."""
        held = self._runs.pop(at, [])
        self._ahead.pop(at, None)
        stay: list[tuple[uuid.UUID, int]] = []
        for run_id, shard in held:
            if ahead and run_id in self._at_instant:
                stay.append((run_id, shard))
                continue
            del self._held[run_id]
            self._at_instant.discard(run_id)
            out.append(DueRun(id=run_id, shard=shard, fire_at=at))
        if stay:
            self._runs[at] = stay

    def drop_shards(self, shards: set[int]) -> None:
        """Forget the runs of shards this node no longer owns."""
        if not shards:
            return
        kept = [
            (DueRun(id=run_id, shard=shard, fire_at=at), run_id in self._at_instant)
            for at, runs in self._runs.items()
            for run_id, shard in runs
            if shard not in shards
        ]
        self._instants, self._runs, self._bursts, self._held = [], {}, [], {}
        self._ahead, self._at_instant = {}, set()
        self.push(run for run, late in kept if not late)
        self.push((run for run, late in kept if late), at_instant=True)
