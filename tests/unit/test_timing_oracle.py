"""The time engine against a brute-force oracle.

The oracle knows nothing of the engine: it builds each expression from value sets it
chose itself, walks every UTC minute (every second for 6-field expressions) of a
padded window, reads the wall clock with zoneinfo, and applies the DST policies by
their definitions — a wall time read twice fires at its earliest reading under
``first``; a wall time the clock jumps over fires at the first instant after the
jump under ``shift``. Windows are drawn mostly around real transitions.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import CronSchedule
from cronwheel.timing import (
    CompiledCron,
    CompiledInterval,
    compile_schedule,
    next_after,
    occurrences,
    parse_cron,
    skipped_nonexistent,
)
from cronwheel.timing.zones import get_zone

Compiled = CompiledCron | CompiledInterval

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

INTERESTING_ZONES = (
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "America/Havana",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "Pacific/Apia",
    "Antarctica/Troll",
    "America/Sao_Paulo",
    "Asia/Tehran",
    "Africa/Casablanca",
    "Europe/Dublin",
    "Asia/Gaza",
    "America/St_Johns",
    "Australia/Adelaide",
    "UTC",
)
ALL_ZONES = tuple(sorted(zoneinfo.available_timezones() - {"localtime", "Factory"}))


@dataclass(frozen=True)
class Expr:
    """An expression and what it means, decided by the oracle, not by a parser."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    day_or: bool
    with_seconds: bool = False

    def matches(self, wall: datetime) -> bool:
        if wall.second not in self.seconds or wall.minute not in self.minutes:
            return False
        if wall.hour not in self.hours or wall.month not in self.months:
            return False
        dom = wall.day in self.days
        dow = (wall.weekday() + 1) % 7 in self.weekdays
        return (dom or dow) if self.day_or else (dom and dow)


@st.composite
def field(
    draw: st.DrawFn,
    low: int,
    high: int,
    names: tuple[str, ...] = (),
    star_weight: int = 1,
    size: int | None = None,
) -> tuple[str, frozenset[int], bool]:
    """``(text, values, starts_with_star)`` of one field. ``size``: how many distinct
    values the field has (day-of-week: 7, its 8th value is Sunday again), which bounds
    a step."""
    size = size or high - low + 1

    def render(v: int) -> str:
        if names and v - low < len(names) and draw(st.booleans()):
            return names[v - low]
        return str(v)

    kind = draw(st.sampled_from(["star"] * star_weight + ["step", "list", "range", "range_step"]))
    if kind == "star":
        return "*", frozenset(range(low, high + 1)), True
    if kind == "step":
        n = draw(st.integers(1, max(1, (high - low + 1) // 2)))
        return f"*/{n}", frozenset(range(low, high + 1, n)), True
    if kind == "list":
        values = draw(st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True))
        return ",".join(render(v) for v in values), frozenset(values), False
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    if kind == "range":
        return f"{render(a)}-{render(b)}", frozenset(range(a, b + 1)), False
    n = draw(st.integers(1, min(size, b - a + 1)))
    return f"{a}-{b}/{n}", frozenset(range(a, b + 1, n)), False


@st.composite
def expressions(draw: st.DrawFn, with_seconds: bool) -> Expr:
    sec_text, seconds, _ = draw(field(0, 59)) if with_seconds else ("", frozenset({0}), True)
    min_text, minutes, _ = draw(field(0, 59, star_weight=2))
    hour_text, hours, _ = draw(field(0, 23, star_weight=3))
    dom_text, days, dom_star = draw(field(1, 31, star_weight=8))
    mon_text, months, _ = draw(field(1, 12, MONTHS, star_weight=12))
    dow_text, weekdays, dow_star = draw(field(0, 7, WEEKDAYS, star_weight=8, size=7))
    weekdays = frozenset(v % 7 for v in weekdays)
    fields = [min_text, hour_text, dom_text, mon_text, dow_text]
    if with_seconds:
        fields.insert(0, sec_text)
    day_or = not dom_star and not dow_star
    if not day_or:  # skip expressions that can never fire, such as "30 2"
        longest = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31}
        longest |= {11: 30, 12: 31}
        if not any(d <= longest[m] for m in months for d in days):
            days = frozenset(range(1, 32))
            fields[-3] = "*"
    text = " ".join(fields)
    return Expr(text, seconds, minutes, hours, days, months, weekdays, day_or, with_seconds)


@lru_cache(maxsize=4096)
def _transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """Instants (naive UTC) where the zone's offset changes during ``year``."""
    zone = zoneinfo.ZoneInfo(zone_name)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    previous = t.astimezone(zone).utcoffset()
    while t.year == year:
        nxt = t + timedelta(hours=6)
        offset = nxt.astimezone(zone).utcoffset()
        if offset != previous:
            lo, hi = t, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == previous:
                    lo = mid
                else:
                    hi = mid
            found.append(hi.replace(tzinfo=None))
            previous = offset
        t = nxt
    return tuple(found)


@dataclass(frozen=True)
class Expected:
    """What the oracle says about ``[start, end)``, in aware UTC and naive wall times."""

    normal: dict[str, list[datetime]]  # by on_ambiguous: instants whose wall time matches
    shifted: list[datetime]  # first instant after a gap holding a matching wall time
    skipped: list[tuple[datetime, datetime]]  # (that instant, the wall time jumped over)

    def due(self, on_ambiguous: str, on_nonexistent: str) -> list[datetime]:
        extra = self.shifted if on_nonexistent == "shift" else []
        return sorted(set(self.normal[on_ambiguous]) | set(extra))


def _oracle(expr: Expr, zone_name: str, start: datetime, end: datetime, pad: timedelta) -> Expected:
    zone = zoneinfo.ZoneInfo(zone_name)
    step = timedelta(seconds=1 if expr.with_seconds else 60)
    readings: list[tuple[datetime, datetime]] = []  # (instant, wall)
    t = (start - pad).replace(second=0, microsecond=0)
    while t < end + pad:
        readings.append((t, t.astimezone(zone).replace(tzinfo=None)))
        t += step
    earliest: dict[datetime, datetime] = {}
    for instant, wall in readings:
        assert wall.microsecond == 0 and (expr.with_seconds or wall.second == 0), (
            "the oracle's step must divide the zone's offsets"
        )
        earliest.setdefault(wall, instant)

    def inside(u: datetime) -> bool:
        return start <= u < end

    matching = [(u, w) for u, w in readings if inside(u) and expr.matches(w)]
    normal = {
        "all": [u for u, _ in matching],
        "first": [u for u, w in matching if earliest[w] == u],
    }
    skipped: list[tuple[datetime, datetime]] = []
    for (_, wall_a), (instant_b, wall_b) in pairwise(readings):
        missing = wall_a + step
        while missing < wall_b:  # the clock jumped over these wall times
            if inside(instant_b) and expr.matches(missing):
                skipped.append((instant_b, missing))
            missing += step
    return Expected(normal, sorted({u for u, _ in skipped}), skipped)


@st.composite
def windows(
    draw: st.DrawFn, zones: tuple[str, ...], longest: timedelta
) -> tuple[str, datetime, datetime]:
    zone = draw(st.sampled_from(zones) | st.sampled_from(ALL_ZONES))
    year = draw(st.integers(1980, 2040))
    changes = _transitions(zone, year)
    if changes and draw(st.integers(0, 4)) > 0:
        centre = draw(st.sampled_from(changes)).replace(tzinfo=UTC)
    else:
        day = draw(st.integers(0, 364))
        centre = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=day)
    seconds = int(longest.total_seconds())
    before = draw(st.integers(0, seconds))
    length = draw(st.integers(60, seconds))
    start = centre - timedelta(seconds=before) + timedelta(microseconds=draw(st.integers(0, 2)))
    return zone, start, start + timedelta(seconds=length)


@lru_cache(maxsize=512)
def _compiled(text: str, zone: str, on_ambiguous: str, on_nonexistent: str) -> Compiled:
    return compile_schedule(
        CronSchedule(
            cron=text,
            timezone=zone,
            on_ambiguous=on_ambiguous,
            on_nonexistent=on_nonexistent,
        )
    )


def _check(expr: Expr, window: tuple[str, datetime, datetime], pad: timedelta) -> None:
    zone, start, end = window
    expected = _oracle(expr, zone, start, end, pad)
    for on_ambiguous in ("first", "all"):
        for on_nonexistent in ("shift", "skip"):
            want = expected.due(on_ambiguous, on_nonexistent)
            got = occurrences(
                expr.text,
                zone,
                start,
                end,
                on_ambiguous=on_ambiguous,
                on_nonexistent=on_nonexistent,
            )
            assert got == want, (expr.text, zone, on_ambiguous, on_nonexistent)
            # The scheduler's path: each due instant leads to the next one.
            compiled = _compiled(expr.text, zone, on_ambiguous, on_nonexistent)
            previous = [start - timedelta(microseconds=1), *got]
            for before, after in zip(previous, got, strict=False):
                assert next_after(compiled, before) == after
            if got:
                following = next_after(compiled, got[-1])
                assert following is None or following >= end
    reported = skipped_nonexistent(expr.text, zone, start, end)
    assert [(o.utc, o.local) for o in reported] == [(u, w.isoformat()) for u, w in expected.skipped]


# No example database: the suite writes nothing into the tree; a failure prints the
# blob that reproduces it.
_SETTINGS = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@settings(_SETTINGS, max_examples=150)
@given(
    expr=expressions(with_seconds=False),
    window=windows(INTERESTING_ZONES, timedelta(hours=36)),
)
def test_minute_expressions_match_the_oracle(
    expr: Expr, window: tuple[str, datetime, datetime]
) -> None:
    _check(expr, window, pad=timedelta(hours=26))


@settings(_SETTINGS, max_examples=30)
@given(
    expr=expressions(with_seconds=True),
    window=windows(INTERESTING_ZONES, timedelta(minutes=90)),
)
def test_second_expressions_match_the_oracle(
    expr: Expr, window: tuple[str, datetime, datetime]
) -> None:
    _check(expr, window, pad=timedelta(hours=4))


def test_the_oracle_sees_both_kinds_of_transition() -> None:
    """The oracle itself: a gap and a fold in New York, as everyone knows them."""
    expr = Expr(
        "30 1,2 * * *",
        frozenset({0}),
        frozenset({30}),
        frozenset({1, 2}),
        frozenset(range(1, 32)),
        frozenset(range(1, 13)),
        frozenset(range(7)),
        day_or=False,
    )
    day = timedelta(days=1)
    spring = datetime(2026, 3, 8, 5, tzinfo=UTC)
    expected = _oracle(expr, "America/New_York", spring, spring + day, day)
    assert [u.isoformat() for u in expected.due("first", "shift")] == [
        "2026-03-08T06:30:00+00:00",  # 01:30 EST
        "2026-03-08T07:00:00+00:00",  # 02:30 does not exist: 03:00 EDT
    ]
    assert [w.isoformat() for _, w in expected.skipped] == ["2026-03-08T02:30:00"]
    autumn = datetime(2026, 11, 1, 4, tzinfo=UTC)
    expected = _oracle(expr, "America/New_York", autumn, autumn + day, day)
    assert [u.isoformat() for u in expected.due("all", "shift")] == [
        "2026-11-01T05:30:00+00:00",  # 01:30 EDT
        "2026-11-01T06:30:00+00:00",  # 01:30 EST
        "2026-11-01T07:30:00+00:00",  # 02:30 EST
    ]
    assert [u.isoformat() for u in expected.due("first", "shift")] == [
        "2026-11-01T05:30:00+00:00",
        "2026-11-01T07:30:00+00:00",
    ]


def test_zone_lookup_accepts_every_zone_the_oracle_draws() -> None:
    for name in ALL_ZONES:
        assert get_zone(name).key == name


# (name, position in a 6-field expression, low, high, distinct values, names)
FIELDS = (
    ("second", 0, 0, 59, 60, ()),
    ("minute", 1, 0, 59, 60, ()),
    ("hour", 2, 0, 23, 24, ()),
    ("day-of-month", 3, 1, 31, 31, ()),
    ("month", 4, 1, 12, 12, MONTHS),
    ("day-of-week", 5, 0, 7, 7, WEEKDAYS),
)
_VALUES = ("seconds", "minutes", "hours", "days", "months", "weekdays")


@settings(_SETTINGS, max_examples=200)
@given(data=st.data())
def test_a_reversed_range_is_refused_and_the_advice_means_its_wrap(data: st.DataObject) -> None:
    """Every reversed range is refused naming its field, and the ranges the message
    offers instead name what a wrap would have: ``a`` to the end, the start to ``b``."""
    name, position, low, high, size, names = data.draw(st.sampled_from(FIELDS))
    a = data.draw(st.integers(low + 1, high))
    b = data.draw(st.integers(low, a - 1))

    def render(v: int) -> str:
        if names and v - low < len(names) and data.draw(st.booleans()):
            return names[v - low]
        return str(v)

    fields = ["0", "0", "0", "1", "*", "*"]
    fields[position] = f"{render(a)}-{render(b)}"
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron(" ".join(fields))
    assert caught.value.details == {"cron_field": name}
    assert f"{name} field '{fields[position]}'" in caught.value.message
    advice = caught.value.message.rsplit("write ", 1)[1].strip("'")
    fields[position] = advice
    parsed = parse_cron(" ".join(fields))
    last = low + size - 1  # day-of-week: 7 is Sunday, the start again
    wrapped = set(range(a, last + 1)) | set(range(low, b + 1))
    assert getattr(parsed, _VALUES[position]) == frozenset(wrapped)


@settings(_SETTINGS, max_examples=200)
@given(data=st.data())
def test_steps_beyond_the_size_of_their_field_are_refused(data: st.DataObject) -> None:
    name, position, low, high, size, _ = data.draw(st.sampled_from(FIELDS))
    step = data.draw(st.just(0) | st.integers(size + 1, 2 * size) | st.integers(2 * size, 10**30))
    base = data.draw(st.sampled_from(["*", f"{low}-{high}", str(low)]))
    fields = ["0", "0", "0", "1", "*", "*"]
    fields[position] = f"{base}/{step}"
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron(" ".join(fields))
    assert caught.value.details == {"cron_field": name}
    assert f"step of {step}; a step is a whole number from 1 to {size}" in caught.value.message
    fields[position] = f"{base}/{data.draw(st.integers(1, size))}"
    assert parse_cron(" ".join(fields))
