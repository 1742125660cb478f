"""Fixed intervals: ``anchor + k * interval`` for k >= 0, counted in elapsed time.

No wall clock is involved, so daylight saving changes nothing. The anchor is the
schedule's ``start``; without one it is the Unix epoch, so that every node — and
every restart — derives the same instants from the spec alone (materialising an
occurrence is idempotent on ``(job, due instant)``). The arithmetic is in integer
microseconds so that a fractional interval never drifts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronwheel.domain.bounds import INTERVAL_MIN
from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import IntervalSchedule

__all__ = ["EPOCH", "MIN_INTERVAL_SECONDS", "CompiledInterval", "compile_interval"]

EPOCH = datetime(1970, 1, 1)  # naive UTC, like every instant inside the engine
# cron's own resolution; anything finer floods a shard. The model refuses it; a stored
# schedule that bypassed the model is refused here.
MIN_INTERVAL_SECONDS = INTERVAL_MIN
_MICRO = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class CompiledInterval:
    """An interval schedule ready to evaluate."""

    anchor: datetime  # naive UTC
    step_us: int

    @property
    def step(self) -> timedelta:
        return timedelta(microseconds=self.step_us)

    def next_after(self, instant: datetime) -> datetime | None:
        """The first occurrence strictly after the naive UTC ``instant``."""
        elapsed = (instant - self.anchor) // _MICRO
        k = 0 if elapsed < 0 else elapsed // self.step_us + 1
        try:
            return self.anchor + timedelta(microseconds=k * self.step_us)
        except OverflowError:
            return None


def compile_interval(spec: IntervalSchedule) -> CompiledInterval:
    """Validate and compile; :class:`InvalidScheduleError` names the field."""
    if spec.interval < MIN_INTERVAL_SECONDS:
        raise InvalidScheduleError(
            f"interval {spec.interval:g} s is too short: the minimum is {MIN_INTERVAL_SECONDS:g} s",
            field="schedule.interval",
        )
    try:
        step_us = round(spec.interval * 1_000_000)
        timedelta(microseconds=step_us)
    except (OverflowError, ValueError) as exc:
        raise InvalidScheduleError(
            f"interval {spec.interval:g} s is too long", field="schedule.interval"
        ) from exc
    anchor = EPOCH if spec.start is None else spec.start.astimezone(UTC).replace(tzinfo=None)
    return CompiledInterval(anchor=anchor, step_us=step_us)
