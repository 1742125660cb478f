"""Cron expressions: syntax checked field by field, expanded by croniter, matched here.

croniter does the expansion (lists, ranges, steps, names, macros); this module adds
what it does not give: error messages that name the bad field, rejection of the
extensions whose meaning is not portable (``L``, ``W``, ``#``, ``H``, ``R``, a year
field), the classic day-of-month / day-of-week rule, and a fast search for the next
matching *wall-clock* time. It knows nothing about time zones: it matches naive
local datetimes, and ``cron_occurrences`` maps them to instants.

Bounds, so that what is accepted means one thing and costs little to read:

- an expression is at most ``MAX_CRON_LENGTH`` characters;
- a field has at most as many list items as it has values (60 for minutes, 7 for
  weekdays): more would name a value twice;
- a step is a whole number from 1 to the number of values of its field (``*/60``
  is minute 0 of every hour; ``*/61`` is refused, as is ``*/0``);
- a range runs from low to high. A reversed one (``22-2``, ``fri-mon``) is refused
  rather than wrapped: croniter wraps it, cronie refuses it and Vixie cron accepts it
  but never fires it, so it has no portable meaning. The message spells the two
  ranges that say it (``22-23,0-2``).

The day rule (cron(5)): when both day fields are restricted — neither starts with
``*`` or ``?`` — a day matches if either does; otherwise it must match both (the
unrestricted one matches every day unless it is a stepped ``*/n``).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache

from croniter import croniter
from croniter.croniter import CroniterError

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import MAX_CRON_LENGTH

__all__ = ["MACROS", "CronExpr", "parse_cron"]

_CRON_FIELD = "schedule.cron"

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Spelled out rather than taken from ``calendar``, whose names follow the locale.
_MONTH_NAMES = {
    n: i
    for i, n in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DOW_NAMES = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


@dataclass(frozen=True, slots=True)
class _FieldRule:
    name: str
    low: int
    high: int
    names: dict[str, int]
    question_mark: bool = False
    top: int | None = None  # the highest value that is not another name of a lower one

    @property
    def last(self) -> int:
        return self.high if self.top is None else self.top

    @property
    def size(self) -> int:
        """How many distinct values the field has: the bound of its steps and lists."""
        return self.last - self.low + 1

    def spell(self, value: int) -> str:
        """``value`` as its name where the field has names."""
        for name, named in self.names.items():
            if named == value:
                return name
        return str(value)

    def describe(self) -> str:
        if self.names:
            first, last = next(iter(self.names)), list(self.names)[-1]
            return f"{self.low}-{self.high} or {first}-{last}"
        return f"{self.low}-{self.high}"


_SECOND = _FieldRule("second", 0, 59, {})
_RULES_5 = (
    _FieldRule("minute", 0, 59, {}),
    _FieldRule("hour", 0, 23, {}),
    _FieldRule("day-of-month", 1, 31, {}, question_mark=True),
    _FieldRule("month", 1, 12, _MONTH_NAMES),
    # 7 is Sunday again: the field has 7 distinct values.
    _FieldRule("day-of-week", 0, 7, _DOW_NAMES, question_mark=True, top=6),
)
_RULES_6 = (_SECOND, *_RULES_5)

_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 0)

_ITEM = re.compile(r"^(?P<base>\*|\?|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/(?P<step>[0-9a-z]*))?$")
_EXTENSION = re.compile(r"^(?:\d*[lw]|lw|h(?:\(.*)?|r)$")


def _bad(message: str, rule: _FieldRule | None = None) -> InvalidScheduleError:
    if rule is None:
        return InvalidScheduleError(message, field=_CRON_FIELD)
    return InvalidScheduleError(message, field=_CRON_FIELD, cron_field=rule.name)


def _value(token: str, text: str, rule: _FieldRule) -> int:
    if token.isdigit():
        if not rule.low <= int(token) <= rule.high:
            raise _bad(f"{rule.name} field '{text}' is out of range {rule.describe()}", rule)
        return int(token)
    if token in rule.names:
        return rule.names[token]
    if rule.names:
        kind = "month" if rule.name == "month" else "weekday"
        raise _bad(
            f"{rule.name} field '{text}': '{token}' is neither a number nor a {kind} name "
            f"(allowed: {rule.describe()})",
            rule,
        )
    raise _bad(f"{rule.name} field '{text}': '{token}' is not a number", rule)


def _is_extension(token: str, rule: _FieldRule) -> bool:
    """``L``, ``15W``, ``5L``, ``H``, ``H(0-29)``, ``R``: Quartz/Jenkins extensions."""
    return token not in rule.names and bool(_EXTENSION.match(token))


def _check_step(step: str, text: str, rule: _FieldRule) -> None:
    if not step.isdigit():
        raise _bad(f"{rule.name} field '{text}' has a step that is not a number", rule)
    if not 1 <= int(step) <= rule.size:
        raise _bad(
            f"{rule.name} field '{text}' has a step of {step}; a step is a whole number "
            f"from 1 to {rule.size}, the number of values of the {rule.name} field",
            rule,
        )


def _unwrapped(tokens: list[str], values: list[int], step: str | None, rule: _FieldRule) -> str:
    """A reversed range ``a-b`` written as ranges that do not wrap: ``a`` to the end of
    the field, then the start of the field to ``b`` (names kept if the range used one)."""
    (first, last), (first_token, last_token) = values, tokens
    by_name = not all(t.isdigit() for t in tokens)
    end = rule.spell(rule.last) if by_name else str(rule.last)
    start = rule.spell(rule.low) if by_name else str(rule.low)
    suffix = f"/{step}" if step is not None else ""
    parts = []
    if first < rule.last:
        parts.append(f"{first_token}-{end}{suffix}")
    elif first == rule.last:
        parts.append(first_token)
    # Otherwise ``a`` is day-of-week 7, Sunday, which the second range starts with.
    parts.append(f"{start}-{last_token}{suffix}" if last > rule.low else last_token)
    return ",".join(parts)


def _check_item(item: str, text: str, rule: _FieldRule) -> str:
    """One list item of a field, as croniter should read it."""
    if not item:
        raise _bad(f"{rule.name} field '{text}' has an empty list item", rule)
    if "#" in item or any(_is_extension(t, rule) for t in re.split(r"[-/]", item)):
        raise _bad(
            f"{rule.name} field '{text}' uses an extension (L, W, #, H or R) that "
            "cronwheel does not support; use numbers, names, '*', lists, ranges and steps",
            rule,
        )
    match = _ITEM.match(item)
    if match is None:
        raise _bad(
            f"{rule.name} field '{text}' is not valid: '{item}' is not a number, "
            "a name, '*', a range 'a-b' or a step 'x/n'",
            rule,
        )
    base, step = match["base"], match["step"]
    if base == "?" and not rule.question_mark:
        raise _bad(f"{rule.name} field '{text}': '?' is only allowed in day fields", rule)
    tokens = [] if base in ("*", "?") else base.split("-")
    values = [_value(t, text, rule) for t in tokens]
    if step is not None:
        _check_step(step, text, rule)
    if len(values) == 2 and values[0] > values[1]:
        raise _bad(
            f"{rule.name} field '{text}': the range '{item}' runs backwards; a range goes "
            f"from low to high and does not wrap around, so write "
            f"'{_unwrapped(tokens, values, step, rule)}'",
            rule,
        )
    # croniter reads a one-value range such as "5-5" as "*": hand it the value.
    return str(values[0]) if len(values) == 2 and values[0] == values[1] else item


def _check_field(text: str, rule: _FieldRule) -> str:
    """Reject, with a message naming the field, what croniter would reject vaguely or
    accept with a meaning cronwheel does not want; return the field as croniter should
    read it."""
    items = text.lower().split(",")
    if len(items) > rule.size:
        raise _bad(
            f"{rule.name} field '{text}' has {len(items)} list items; at most {rule.size}, "
            f"the number of values of the {rule.name} field",
            rule,
        )
    return ",".join(_check_item(item, text, rule) for item in items)


def _split(expr: str) -> tuple[str, ...]:
    """The fields of the expression, macros resolved."""
    text = " ".join(expr.split())
    if not text:
        raise _bad("the cron expression is empty")
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise _bad(
                f"unknown cron macro '{text}'; supported: {', '.join(MACROS)}",
            )
        text = macro
    fields = tuple(text.split(" "))
    if len(fields) not in (5, 6):
        raise _bad(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
            f"or 6 with a leading second field; '{expr.strip()}' has {len(fields)}"
        )
    return fields


def _next_table(allowed: frozenset[int], high: int) -> tuple[int, ...]:
    """``table[v]``: the smallest allowed value >= v, or -1; one slot past ``high`` so that
    a carry into it reads -1."""
    table = [-1] * (high + 2)
    nxt = -1
    for v in range(high, -1, -1):
        if v in allowed:
            nxt = v
        table[v] = nxt
    return tuple(table)


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the allowed values of each field (weekday 0 = Sunday)."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    day_or: bool  # both day fields restricted: a day matches if either does
    has_seconds: bool
    _sec: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _min: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hour: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _month: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _dom: tuple[bool, ...] = field(init=False, repr=False, compare=False)
    _dow: tuple[bool, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        setter = object.__setattr__
        setter(self, "_sec", _next_table(self.seconds, 59))
        setter(self, "_min", _next_table(self.minutes, 59))
        setter(self, "_hour", _next_table(self.hours, 23))
        setter(self, "_month", _next_table(self.months, 12))
        setter(self, "_dom", tuple(d in self.days for d in range(32)))
        setter(self, "_dow", tuple(d in self.weekdays for d in range(7)))

    def day_matches(self, day: int, weekday: int) -> bool:
        """``weekday`` in cron numbering (0 = Sunday)."""
        if self.day_or:
            return self._dom[day] or self._dow[weekday]
        return self._dom[day] and self._dow[weekday]

    def matches(self, wall: datetime) -> bool:
        return (
            wall.microsecond == 0
            and wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.day, (wall.weekday() + 1) % 7)
        )

    def next_match(self, start: datetime, end: datetime) -> datetime | None:
        """The first wall time ``t`` with ``start <= t < end`` that matches (naive)."""
        if start.microsecond:
            start += timedelta(microseconds=1_000_000 - start.microsecond)
        y, mo, d = start.year, start.month, start.day
        h, mi, s = start.hour, start.minute, start.second
        end_y, end_mo = end.year, end.month
        month_next, hour_next, min_next, sec_next = self._month, self._hour, self._min, self._sec
        while True:
            if y > end_y or (y == end_y and mo > end_mo):
                return None
            nm = month_next[mo]
            if nm < 0:
                y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                continue
            if nm != mo:
                mo, d, h, mi, s = nm, 1, 0, 0, 0
                continue
            dim = _DAYS_IN_MONTH[mo]
            if mo == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0):
                dim = 29
            if d <= dim:
                wd = date(y, mo, d).toordinal() % 7  # ordinal 1 is a Monday: Sunday is 0
                nd = d
                while nd <= dim and not self.day_matches(nd, wd):
                    nd += 1
                    wd = (wd + 1) % 7
            else:
                nd = d
            if nd > dim:
                mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
                continue
            if nd != d:
                d, h, mi, s = nd, 0, 0, 0
            nh = hour_next[h]
            if nh < 0:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if nh != h:
                h, mi, s = nh, 0, 0
            nmi = min_next[mi]
            if nmi < 0:
                h, mi, s = h + 1, 0, 0
                continue
            if nmi != mi:
                mi, s = nmi, 0
            ns = sec_next[s]
            if ns < 0:
                mi, s = mi + 1, 0
                continue
            found = datetime(y, mo, d, h, mi, ns)
            return found if found < end else None


def _full(value: list[int | str], rule: _FieldRule) -> frozenset[int]:
    if value == ["*"]:
        return frozenset(range(rule.low, rule.last + 1))
    numbers = {int(v) for v in value}
    if rule.name == "day-of-week":
        numbers = {v % 7 for v in numbers}
    return frozenset(numbers)


def _expand(text: str, fields: tuple[str, ...], rules: tuple[_FieldRule, ...]) -> CronExpr:
    try:
        expanded, nth = croniter.expand(text, second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError) as exc:
        # Find the field croniter objects to, so the message points at it.
        for i, rule in enumerate(rules):
            alone = " ".join(f if j == i else "*" for j, f in enumerate(fields))
            try:
                croniter.expand(alone, second_at_beginning=len(fields) == 6)
            except (CroniterError, ValueError):
                raise _bad(f"{rule.name} field '{fields[i]}' is invalid ({exc})", rule) from exc
        raise _bad(f"the cron expression '{text}' is invalid ({exc})") from exc
    if nth:  # unreachable after _check_field rejects '#', kept as a guard
        raise _bad("the '#' (nth weekday) extension is not supported")
    values = expanded[5:6] + expanded[:5] if len(fields) == 6 else [["0"], *expanded]
    by_name = dict(zip(("second", *(r.name for r in _RULES_5)), values, strict=True))
    sets = {r.name: _full(by_name[r.name], r) for r in _RULES_6}
    dom_text, dow_text = fields[-3], fields[-1]
    day_or = not dom_text.startswith(("*", "?")) and not dow_text.startswith(("*", "?"))
    return CronExpr(
        text=text,
        seconds=sets["second"],
        minutes=sets["minute"],
        hours=sets["hour"],
        days=sets["day-of-month"],
        months=sets["month"],
        weekdays=sets["day-of-week"],
        day_or=day_or,
        has_seconds=len(fields) == 6,
    )


def _check_possible(expr: CronExpr, fields: tuple[str, ...]) -> None:
    """Reject expressions that can never fire, such as ``0 0 30 2 *``."""
    if expr.day_or:
        return
    longest = {m: calendar.monthrange(2000, m)[1] for m in expr.months}  # 2000: Feb 29
    if any(d <= longest[m] for m in expr.months for d in expr.days):
        return
    rule = _RULES_5[2]
    raise _bad(
        f"day-of-month field '{fields[-3]}' never occurs in month field '{fields[-2]}': "
        "the expression would never fire",
        rule,
    )


@lru_cache(maxsize=4096)
def parse_cron(expr: str) -> CronExpr:
    """Parse and validate ``expr``; raise :class:`InvalidScheduleError` (field
    ``schedule.cron``) whose message names the bad cron field."""
    if not isinstance(expr, str):
        raise _bad("the cron expression must be a string")
    if len(expr) > MAX_CRON_LENGTH:
        raise _bad(
            f"the cron expression is {len(expr)} characters long; "
            f"at most {MAX_CRON_LENGTH} are allowed"
        )
    fields = _split(expr)
    rules = _RULES_6 if len(fields) == 6 else _RULES_5
    fields = tuple(_check_field(f, r) for f, r in zip(fields, rules, strict=True))
    parsed = _expand(" ".join(fields), fields, rules)
    _check_possible(parsed, fields)
    return parsed
