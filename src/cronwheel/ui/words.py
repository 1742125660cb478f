"""A job's schedule in words, for people: ``every 5 minutes``, ``at 09:30 on Monday
through Friday (Europe/Paris)``.

A small formatter of the common shapes of a cron expression — every field a ``*``, a
number, a list, a range or a step — spelled field by field; whatever it does not
recognise it leaves to the expression, shown beside the words on every page.
"""

from __future__ import annotations

from typing import Any

from cronwheel.timing.cron import MACROS

__all__ = ["cron_in_words", "schedule_in_words", "seconds_in_words"]

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July",
    "August", "September", "October", "November", "December",
)  # fmt: skip
_DAY_NAMES = {d[:3].lower(): i for i, d in enumerate(_DAYS)}
_MONTH_NAMES = {m[:3].lower(): i + 1 for i, m in enumerate(_MONTHS)}


def seconds_in_words(seconds: float) -> str:
    """``90`` → ``1 minute 30 seconds``; ``3600`` → ``hour``-sized words."""
    whole = int(seconds)
    if whole != seconds or whole <= 0:
        return f"{seconds:g} seconds"
    parts = []
    for size, name in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if whole >= size:
            count, whole = divmod(whole, size)
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
    return " ".join(parts)


def _every(seconds: float) -> str:
    text = seconds_in_words(seconds)
    return "every " + (text[2:] if text.startswith("1 ") and " " not in text[2:] else text)


def _value(token: str, names: dict[str, int]) -> int | None:
    token = token.lower()
    if token.isdigit():
        return int(token)
    return names.get(token)


def _items(field: str, names: dict[str, int], spell: Any) -> str | None:
    """A list of numbers and ranges in words, or None when it is anything else."""
    words = []
    for item in field.split(","):
        low, dash, high = item.partition("-")
        a = _value(low, names)
        b = _value(high, names) if dash else a
        if a is None or b is None:
            return None
        words.append(spell(a) if a == b else f"{spell(a)} through {spell(b)}")
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]


def _day(n: int) -> str:
    return _DAYS[n % 7]


def _month(n: int) -> str:
    return _MONTHS[n - 1] if 1 <= n <= 12 else str(n)


def _step(field: str) -> int | None:
    if field.startswith("*/") and field[2:].isdigit():
        return int(field[2:])
    return None


def cron_in_words(expression: str) -> str | None:
    """The expression in words, or None when it has a shape this does not spell."""
    fields = MACROS.get(expression.strip().lower(), expression).split()
    if len(fields) == 6:
        if fields[0] != "0":
            return None
        fields = fields[1:]
    if len(fields) != 5:
        return None
    minute, hour, dom, month, dow = fields
    if minute == "*" and hour == "*":
        when = "every minute"
    elif (step := _step(minute)) is not None and hour == "*":
        when = f"every {step} minutes"
    elif minute.isdigit() and hour == "*":
        when = f"at minute {int(minute)} of every hour"
    elif minute.isdigit() and (step := _step(hour)) is not None:
        when = f"at minute {int(minute)} of every {step} hours"
    elif minute.isdigit() and hour.isdigit():
        when = f"at {int(hour):02d}:{int(minute):02d}"
    elif minute.isdigit() and (hours := _items(hour, {}, lambda h: f"{h:02d}")) is not None:
        when = f"at minute {int(minute)} of hours {hours}"
    else:
        return None
    days = []
    if dom not in ("*", "?"):
        spelled = _items(dom, {}, str)
        if spelled is None:
            return None
        days.append(f"on day {spelled} of the month")
    if dow not in ("*", "?"):
        spelled = _items(dow, _DAY_NAMES, _day)
        if spelled is None:
            return None
        days.append(f"on {spelled}")
    if month != "*":
        spelled = _items(month, _MONTH_NAMES, _month)
        if spelled is None:
            return None
        days.append(f"in {spelled}")
    if not days and when.startswith("at ") and ":" in when:
        days.append("every day")
    # Both day fields restricted: a day matches if either does (cron(5)).
    joiner = " or " if dom not in ("*", "?") and dow not in ("*", "?") else " "
    if len(days) > 1 and joiner == " or ":
        days = [days[0] + " or " + days[1], *days[2:]]
    return " ".join([when, *days])


def schedule_in_words(schedule: dict[str, Any]) -> str:
    """Any stored schedule in words."""
    if "cron" in schedule:
        words = cron_in_words(str(schedule["cron"])) or f"on the cron schedule {schedule['cron']}"
        return f"{words} ({schedule.get('timezone', 'UTC')})"
    if "interval" in schedule:
        return _every(float(schedule["interval"]))
    if "delay" in schedule:
        return f"once, {seconds_in_words(float(schedule['delay']))} after it was created"
    if "at" in schedule:
        return f"once, at {schedule['at']}"
    if schedule.get("asap"):
        return "once, as soon as possible"
    return "unknown schedule"
