"""The clock's offset from the database: a lower bound that later readings narrow, so a
reading taken while the process was busy does not set the clock back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronwheel.clock import Clock

T0 = datetime(2031, 5, 6, 7, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)


class Readings:
    """A local clock and a database whose clock is ``offset`` ahead of it; each
    database reading takes ``before`` to reach the database and ``after`` to come back
    (the local clock moves by them)."""

    def __init__(self, offset: timedelta) -> None:
        self.local = T0
        self.offset = offset
        self.before = MS
        self.after = MS

    def now(self) -> datetime:
        return self.local

    async def db_now(self) -> datetime:
        self.local += self.before
        read = self.local + self.offset
        self.local += self.after
        return read


async def test_a_reading_answered_late_does_not_set_the_clock_back() -> None:
    db = Readings(offset=timedelta(seconds=2))
    clock = Clock(db.now)
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=2) - MS  # late by the way back, never early
    db.after = 25 * MS  # every answer read 25 ms late: a busy process
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=2) - MS
    assert clock.drift == timedelta(0)
    assert clock.round_trip == 26 * MS  # the latest reading's, as it was


async def test_a_tighter_reading_narrows_the_offset_and_never_passes_it() -> None:
    db = Readings(offset=timedelta(seconds=-1))
    db.before, db.after = MS, 9 * MS
    clock = Clock(db.now)
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=-1) - 9 * MS
    db.before, db.after = 5 * MS, MS
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=-1) - MS
    assert clock.offset <= db.offset


async def test_a_local_clock_that_steps_starts_afresh_and_shows_as_drift() -> None:
    db = Readings(offset=timedelta(0))
    clock = Clock(db.now)
    await clock.measure(db)  # type: ignore[arg-type]
    db.local += timedelta(seconds=3)  # the local clock jumps ahead: the offset is now -3 s
    db.offset = timedelta(seconds=-3)
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=-3) - MS  # not held at the old bounds
    assert clock.drift == timedelta(seconds=3)
    # A bound from before the step would make the clock run 3 s ahead: it is gone.
    db.after = 50 * MS
    await clock.measure(db)  # type: ignore[arg-type]
    assert clock.offset == timedelta(seconds=-3) - MS
