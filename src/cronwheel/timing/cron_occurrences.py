"""Cron on a wall clock: from local matches to UTC instants, with the DST policies.

An expression is matched against the *wall clock* of its zone. The UTC timeline is
walked piece by piece (``zones.Piece``: an interval of constant offset); inside a
piece wall time and UTC move together, so the next match there is one search in the
piece's local range ``[start + offset, end + offset)``. Between pieces::

    spring forward (gap)                       fall back (fold)
    wall  01:59 ─┐      ┌─ 03:00               wall 01:59 ─┐ ┌─ 01:00 … 01:59 ─ 02:00
    UTC   06:59  └─ T ──┘  07:00               UTC  05:59  └T┘  06:00 … 06:59   07:00
          02:00-02:59 exist nowhere                  01:00-01:59 happen twice

- gap, ``on_nonexistent="shift"``: a matching wall time inside the gap fires once at
  ``T``, the transition instant, whose wall time is the end of the gap (03:00). All
  the matches of one gap collapse into that one firing, and when the expression
  also matches the wall time at ``T`` it is the same firing, not a second one.
  ``"skip"``: it does not fire; ``skipped`` reports it with its reason.
- fold, ``on_ambiguous="first"``: a repeated wall time fires at its earlier instant
  only; ``"all"``: at both, two distinct UTC instants whose local forms carry their
  own offsets (``01:30-04:00`` and ``01:30-05:00``).

Wall times the expression names twice are told apart without asking for transitions:
a wall time ``L`` found in a piece with offset ``o`` is the second of a fold exactly
when zoneinfo's ``fold=0`` reading of ``L`` has another offset. That only happens
within ``MAX_JUMP`` of a piece's start, so the hot path asks zoneinfo nothing.
"""

from __future__ import annotations

import bisect
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Literal

from cronwheel.timing.cron import CronExpr
from cronwheel.timing.zones import (
    MAX_JUMP,
    MAX_YEAR,
    MIN_YEAR,
    offset_at,
    pieces_from,
    to_aware,
    transition_between,
    year_pieces,
)

__all__ = [
    "HORIZON_YEARS",
    "CompiledCron",
    "Occurrence",
    "OccurrenceKind",
    "cron_next",
    "iter_cron",
    "skipped_in",
]

# Beyond the longest wait of any valid expression (a date that must also be a given
# weekday recurs within about 28 years); past it, a schedule whose every match falls
# into a skipped gap reports that it has no next occurrence.
HORIZON_YEARS = 60

OccurrenceKind = Literal["normal", "ambiguous-first", "ambiguous-second", "shifted", "skipped"]

_SECOND = timedelta(seconds=1)
_START = itemgetter(0)


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One due instant of a schedule, or one wall time it skipped.

    ``local`` is the ISO-8601 wall time with the instant's own offset; for a
    ``skipped`` wall time, which never existed, it has no offset. ``utc`` of a skipped
    or shifted occurrence is the transition instant at the end of the gap. ``reason``
    says why a run is skipped or moved; ``nominal`` is the wall time the expression
    named when it differs from the one the run fires at.
    """

    utc: datetime
    local: str
    kind: OccurrenceKind
    reason: str | None = None
    nominal: str | None = None


@dataclass(frozen=True, slots=True)
class CompiledCron:
    """A cron schedule ready to evaluate: expression, zone and DST policies."""

    expr: CronExpr
    zone: zoneinfo.ZoneInfo
    on_ambiguous: Literal["first", "all"] = "first"
    on_nonexistent: Literal["shift", "skip"] = "shift"


def _strictly_after(instant: datetime, offset: timedelta) -> datetime:
    """The first whole-second wall time whose instant is after ``instant``."""
    wall = instant + offset
    if wall.microsecond:
        wall -= timedelta(microseconds=wall.microsecond)
    return wall + _SECOND


def _reading(c: CompiledCron, wall: datetime, fold: int) -> timedelta | None:
    """zoneinfo's offset for the wall time, earlier (fold 0) or later (fold 1) reading."""
    return datetime(
        wall.year, wall.month, wall.day, wall.hour, wall.minute, wall.second,
        tzinfo=c.zone, fold=fold,
    ).utcoffset()  # fmt: skip


def _fold_end(c: CompiledCron, wall: datetime, offset: timedelta, earlier: timedelta) -> datetime:
    """The wall time where the repeated stretch holding ``wall`` ends."""
    transition = transition_between(c.zone, wall - earlier, wall - offset)
    return transition + earlier


def cron_next(
    c: CompiledCron, instant: datetime, *, with_kind: bool = False
) -> tuple[datetime, timedelta, OccurrenceKind] | None:
    """The first due instant strictly after the naive UTC ``instant``: ``(instant,
    offset, kind)``, or None when there is none within ``HORIZON_YEARS``.

    ``kind`` tells ``ambiguous-first`` from ``normal`` only when ``with_kind``.
    """
    if instant.year < MIN_YEAR:
        instant = datetime(MIN_YEAR, 1, 1)
    if instant.year > MAX_YEAR:
        return None
    year = instant.year
    last_year = min(year + HORIZON_YEARS, MAX_YEAR)
    zone, expr, first_only = c.zone, c.expr, c.on_ambiguous == "first"
    shift = c.on_nonexistent == "shift"
    table = year_pieces(zone, year)
    index = bisect.bisect_right(table, instant, key=_START) - 1
    while True:
        if index == len(table):
            year += 1
            if year > last_year:
                return None
            table, index = year_pieces(zone, year), 0
        start, offset, before = table[index]
        index += 1
        end = table[index][0] if index < len(table) else datetime(year + 1, 1, 1)
        if start > instant:
            in_gap = shift and before < offset
            if in_gap and expr.next_match(start + before, start + offset) is not None:
                return start, offset, "shifted"
            low = start + offset
        else:
            low = _strictly_after(instant, offset)
        high = end + offset
        while (wall := expr.next_match(low, high)) is not None:
            kind: OccurrenceKind = "normal"
            utc = wall - offset
            if utc - start < MAX_JUMP and (with_kind or first_only):
                earlier = _reading(c, wall, 0)
                if earlier is not None and earlier != offset:  # the fold's second reading
                    if first_only:
                        low = max(wall + _SECOND, _fold_end(c, wall, offset, earlier))
                        continue
                    kind = "ambiguous-second"
            if with_kind and kind == "normal" and end - utc < MAX_JUMP:
                later = _reading(c, wall, 1)
                if later is not None and later != offset:
                    kind = "ambiguous-first"
            return utc, offset, kind


def _wall_iso(wall: datetime) -> str:
    return wall.isoformat()


def _gap_reason(c: CompiledCron, wall: datetime, gap_start: datetime, gap_end: datetime) -> str:
    return (
        f"local time {_wall_iso(wall)} does not exist in {c.zone.key}: the clocks jumped "
        f"from {_wall_iso(gap_start)} to {_wall_iso(gap_end)}"
    )


def _occurrence(
    c: CompiledCron, utc: datetime, offset: timedelta, kind: OccurrenceKind
) -> Occurrence:
    aware = to_aware(utc)
    local = aware.astimezone(c.zone).isoformat()
    if kind != "shifted":
        return Occurrence(aware, local, kind)
    if c.expr.matches(utc + offset):
        # The wall time at the end of the gap fires anyway: the same run, not a move.
        return Occurrence(aware, local, "normal")
    gap_start, gap_end = utc + offset_at(c.zone, utc - _SECOND), utc + offset
    named = list(_gap_matches(c, gap_start, gap_end))
    extra = f" (and {len(named) - 1} more in the same gap)" if len(named) > 1 else ""
    reason = (
        _gap_reason(c, named[0], gap_start, gap_end)
        + f"{extra}; shifted to the first instant after the gap"
    )
    return Occurrence(aware, local, "shifted", reason=reason, nominal=_wall_iso(named[0]))


def _gap_matches(c: CompiledCron, low: datetime, high: datetime) -> Iterator[datetime]:
    wall = c.expr.next_match(low, high)
    while wall is not None:
        yield wall
        wall = c.expr.next_match(wall + _SECOND, high)


def skipped_in(c: CompiledCron, start: datetime, end: datetime) -> Iterator[Occurrence]:
    """Each wall time the expression names inside a spring-forward gap whose
    transition instant is in ``[start, end)`` (naive UTC), as a ``skipped``
    occurrence — regardless of the policy; the caller decides what they mean."""
    if start >= end or start.year > MAX_YEAR:
        return
    start = max(start, datetime(MIN_YEAR, 1, 1))
    last_year = min(end.year, MAX_YEAR)
    for piece in pieces_from(c.zone, start, last_year):
        if piece.start >= end:
            return
        if piece.start < start or piece.before >= piece.offset:
            continue
        low, high = piece.start + piece.before, piece.start + piece.offset
        aware = to_aware(piece.start)
        for wall in _gap_matches(c, low, high):
            reason = _gap_reason(c, wall, low, high) + "; on_nonexistent is 'skip'"
            yield Occurrence(aware, _wall_iso(wall), "skipped", reason=reason, nominal=None)


def iter_cron(
    c: CompiledCron, start: datetime, end: datetime | None, *, include_skipped: bool = False
) -> Iterator[Occurrence]:
    """Occurrences with ``start <= utc < end`` (naive UTC; ``end=None``: no end), in
    order. ``include_skipped`` (with ``on_nonexistent="skip"``) interleaves the skipped
    wall times, each before any run due at the same instant."""
    skipping = include_skipped and c.on_nonexistent == "skip"
    cursor = start - timedelta(microseconds=1)
    window_start = start
    while True:
        found = cron_next(c, cursor, with_kind=True)
        if found is not None and end is not None and found[0] >= end:
            found = None
        if skipping:
            window_end = found[0] + _SECOND if found is not None else end
            if window_end is not None:
                yield from skipped_in(c, window_start, window_end)
                window_start = window_end
        if found is None:
            return
        utc, offset, kind = found
        yield _occurrence(c, utc, offset, kind)
        cursor = utc
