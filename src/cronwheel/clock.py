"""Time as the database tells it: the local clock corrected by its measured offset
from the database clock, the authority for what is due and for leases."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cronwheel.store.base import Store

__all__ = ["Clock"]


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

    def now(self) -> datetime:
        return self.local() + self.offset

    def store_now(self) -> datetime | None:
        """What to pass as ``now`` to the store: None (the database clock, the authority)
        unless this clock was injected with a fixed offset, as tests do to drive time."""
        return self.now() if self.fixed else None

    async def measure(self, store: Store, samples: int = 3) -> timedelta:
        """The offset from the database clock, as a lower bound: the database read its
        clock before our second reading, so ``db - t1`` never runs ahead of it. Firing
        by this time is never early by the database's clock, and late by at most the
        round trip of the best of ``samples`` readings. ``round_trip`` records it, and
        ``drift`` how much the offset moved since the previous measurement (a local clock
        stepped or slewing fast)."""
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
        self.round_trip, self.offset = best
        self.drift = abs(self.offset - previous) if previous is not None else timedelta(0)
        self._measured = True
        return self.offset

    @property
    def uncertainty(self) -> timedelta:
        """How far corrected time may be off the database's: the larger of the last
        reading's round trip and the drift since the reading before."""
        return max(self.round_trip, self.drift)
