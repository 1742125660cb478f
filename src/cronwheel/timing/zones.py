"""Time zones as the engine needs them: validated names, and the UTC timeline cut into
*pieces* of constant offset.

``zoneinfo`` answers "what is the offset at this instant" but does not list the
transitions, so each (zone, year) is probed every 12 hours and every change of
offset is narrowed to the second by bisection; the result is cached. The probe step
is safe because no zone in the tz database has two offset changes less than four
days apart, and none moves its clocks by more than 24 hours (Alaska in 1867, the
Marshall Islands in 1993) — ``MAX_JUMP`` below relies on that bound.

A year's table starts with a piece at 1 January 00:00 UTC even when nothing happens
there; such a boundary has ``before == offset`` and is no transition. All instants
here are *naive UTC* datetimes: the engine strips ``tzinfo`` once at its edges so
the arithmetic inside stays cheap.
"""

from __future__ import annotations

import bisect
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

from cronwheel.domain.errors import InvalidScheduleError

__all__ = [
    "MAX_JUMP",
    "MAX_YEAR",
    "MIN_YEAR",
    "Piece",
    "get_zone",
    "local_form",
    "offset_at",
    "pieces_from",
    "to_aware",
    "to_naive",
    "transition_between",
    "year_pieces",
]

_TIMEZONE_FIELD = "schedule.timezone"

MAX_JUMP = timedelta(hours=25)  # larger than any offset change, with a margin
MIN_YEAR = 2  # keeps "one second before 1 January" representable
MAX_YEAR = 9998  # keeps local wall times a day past the year representable

_PROBE = timedelta(hours=12)
_ONE_SECOND = timedelta(seconds=1)
# Names that load but name no place: the host's own zone (its meaning changes with
# the machine), the template of the tz build, and the "-00" placeholder.
_REFUSED = frozenset({"localtime", "posixrules", "Factory"})


# ``datetime.replace`` costs microseconds; epoch arithmetic costs ~0.1 µs.
_AWARE_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)


def to_naive(instant: datetime) -> datetime:
    """An aware instant as naive UTC."""
    return _NAIVE_EPOCH + (instant - _AWARE_EPOCH)


def to_aware(instant: datetime) -> datetime:
    """A naive UTC instant as aware UTC."""
    return _AWARE_EPOCH + (instant - _NAIVE_EPOCH)


class Piece(NamedTuple):
    """``[start, end)`` in naive UTC with one offset; ``before`` is the offset just
    before ``start`` (equal to ``offset`` when ``start`` is no transition)."""

    start: datetime
    end: datetime
    offset: timedelta
    before: timedelta


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _REFUSED


def get_zone(name: str | zoneinfo.ZoneInfo) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``; :class:`InvalidScheduleError` (field
    ``schedule.timezone``) naming it when it is unknown."""
    if isinstance(name, zoneinfo.ZoneInfo):
        name = name.key
    if not isinstance(name, str):
        raise InvalidScheduleError(
            f"the time zone must be an IANA name, not {name!r}", field=_TIMEZONE_FIELD
        )
    return _load(name)


@lru_cache(maxsize=1024)
def _load(name: str) -> zoneinfo.ZoneInfo:
    known = _known_zones()
    if name not in known:
        folded = {z.lower(): z for z in known}
        hint = f" (did you mean '{folded[name.lower()]}'?)" if name.lower() in folded else ""
        raise InvalidScheduleError(
            f"unknown time zone '{name}'{hint}: use an IANA name such as 'Europe/Paris' or 'UTC'",
            field=_TIMEZONE_FIELD,
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:  # pragma: no cover
        raise InvalidScheduleError(
            f"time zone '{name}' cannot be loaded", field=_TIMEZONE_FIELD
        ) from exc


def offset_at(zone: zoneinfo.ZoneInfo, instant: datetime) -> timedelta:
    """The UTC offset of ``zone`` at the naive UTC ``instant``."""
    offset = to_aware(instant).astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def transition_between(zone: zoneinfo.ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The instant in ``(low, high]`` where the offset stops being ``offset_at(low)``.

    Both bounds are whole seconds and ``high`` already has another offset; transitions
    in the tz database fall on whole seconds, so bisection to one second is exact.
    """
    first = offset_at(zone, low)
    lo, hi = low, high
    while hi - lo > _ONE_SECOND:
        mid = lo + timedelta(seconds=(hi - lo) // _ONE_SECOND // 2)
        if offset_at(zone, mid) == first:
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=8192)
def year_pieces(
    zone: zoneinfo.ZoneInfo, year: int
) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """``(start, offset, before)`` of each piece of ``year`` (UTC), in order."""
    begin = datetime(year, 1, 1)
    stop = datetime(year + 1, 1, 1)
    current = offset_at(zone, begin)
    table = [(begin, current, offset_at(zone, begin - _ONE_SECOND))]
    probe = begin
    while probe < stop:
        nxt = min(probe + _PROBE, stop - _ONE_SECOND)
        if nxt <= probe:
            break
        offset = offset_at(zone, nxt)
        if offset != current:
            table.append((transition_between(zone, probe, nxt), offset, current))
            current = offset
        probe = nxt
    return tuple(table)


_START = itemgetter(0)


def pieces_from(zone: zoneinfo.ZoneInfo, instant: datetime, last_year: int) -> Iterator[Piece]:
    """The pieces from the one holding ``instant`` to the end of ``last_year``."""
    year = instant.year
    table = year_pieces(zone, year)
    index = bisect.bisect_right(table, instant, key=_START) - 1
    while year <= last_year:
        year_end = datetime(year + 1, 1, 1)
        for i in range(index, len(table)):
            start, offset, before = table[i]
            end = table[i + 1][0] if i + 1 < len(table) else year_end
            yield Piece(start, end, offset, before)
        year += 1
        if year > last_year:
            return
        table = year_pieces(zone, year)
        index = 0


def local_form(instant: datetime, zone: zoneinfo.ZoneInfo | str) -> str:
    """``instant`` as ISO-8601 wall time in ``zone`` with that instant's own offset,
    e.g. ``2026-11-01T01:30:00-05:00`` for the second 01:30 of a fall-back night."""
    if instant.tzinfo is None:
        raise ValueError("local_form needs an aware instant")
    tz = get_zone(zone) if isinstance(zone, str) else zone
    return instant.astimezone(tz).isoformat()
