"""Time as the database tells it: the local clock corrected by its measured offset
from the database clock, the authority for what is due and for leases."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cronwheel.store.base import Store

__all__ = ["Clock"]

# How long a reading keeps narrowing the later ones (see ``Clock.measure``): long
# enough to span a few measurements, short against how far a local clock drifts.
_NARROWS_FOR = 300.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Clock:
    """Local time corrected by the measured offset from the database clock."""

    def __init__(
        self, local: Callable[[], datetime] = _utcnow, *, offset: timedelta | None = None
    ) -> None:
        """``offset`` fixes the correction (tests); otherwise it is measured."""
        self.local = local
        self.fixed = offset is not None
        self.offset = offset or timedelta(0)
        self.round_trip = timedelta(0)
        self.drift = timedelta(0)  # the offset's change between the last two readings
        self._measured = False
        # What the readings so far allow of the offset: (lowest, highest, since when
        # (monotonic) they have been narrowing it).
        self._bounds: tuple[timedelta, timedelta, float] | None = None

    def now(self) -> datetime:
        return self.local() + self.offset

    def store_now(self) -> datetime | None:
        """What to pass as ``now`` to the store: None (the database clock, the authority)
        unless this clock was injected with a fixed offset, as tests do to drive time."""
        return self.now() if self.fixed else None

    async def measure(self, store: Store, samples: int = 3) -> timedelta:
        """The offset from the database clock, as a lower bound: the database read its
        clock between our two readings, so the offset lies between ``db - t1`` and
        ``db - t0``, and the lower end never runs ahead of it. Firing by this time is
        never early by the database's clock, and late by at most the round trip of the
        best of ``samples`` readings — or less: a reading that agrees with the earlier
        ones of the last few minutes narrows what they allowed, so one taken while this
        process was busy (every answer read late) cannot set the clock back by the
        delay. One that disagrees (the local clock stepped) starts afresh.
        ``round_trip`` records the best reading's, and ``drift`` how much the offset
        moved since the previous measurement."""
        if self.fixed:
            return self.offset
        best: tuple[timedelta, timedelta] | None = None
        for _ in range(samples):
            t0 = self.local()
            db = await store.db_now()
            t1 = self.local()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, db - t1)
        assert best is not None
        previous = self.offset if self._measured else None
        self.round_trip, low = best
        high, since = low + self.round_trip, time.monotonic()
        if self._bounds is not None:
            was_low, was_high, was_since = self._bounds
            if since - was_since < _NARROWS_FOR and low <= was_high and was_low <= high:
                low, high, since = max(low, was_low), min(high, was_high), was_since
        self._bounds = (low, high, since)
        self.offset = low
        self.drift = abs(self.offset - previous) if previous is not None else timedelta(0)
        self._measured = True
        return self.offset

    @property
    def uncertainty(self) -> timedelta:
        """How far corrected time may be off the database's: the larger of the last
        reading's round trip and the drift since the reading before."""
        return max(self.round_trip, self.drift)
