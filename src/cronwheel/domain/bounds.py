"""Bounds on what clients hand cronwheel, declared once and used by every model.

Each bound keeps a value inside what every part of the system can hold, whatever is
done with it later: an instant moved by any offset, timeout, retry delay or window is
still a datetime that Python, PostgreSQL and SQLite all store; a duration is a finite
number of seconds; a string can be written to either database; a JSON value is
finite, shallow enough to walk without recursion limits, and small.

::

    instants     1970-01-01T00:00:00Z … 9999-01-01T00:00:00Z, any offset up to ±23:59
    delay        0 … 10 years (and no further than the server's horizon)
    interval     1 s … 10 years
    retry delays 0 … 30 days (initial_delay, max_delay; a worker's retry_after ≤ 7 days)
    timeout      > 0 … 7 days;  heartbeat_timeout 1 s … 1 h
    catch-up     catch_up_window > 0 … 366 days
    backfill     rate 0.001 … 1000 runs a second (10,000 runs spread over ≤ 116 days)
    strings      no NUL, no unpaired surrogate; names, tasks, pools, tags and
                 capabilities are printable text (no control characters)
    JSON         strict (NaN and ±Infinity are not JSON); nesting ≤ 32 levels counted
                 from the request body; a payload ≤ the server's max_payload_bytes
    types        JSON's own: a number is a number (not a boolean, not text), an
                 integer is written as one (2, not 2.0), a boolean is true or false,
                 an instant is ISO-8601 text (never a number of seconds since 1970)

The store trusts what passed these bounds, but the scheduler never trusts a row: a row
that breaks a step of its pass anyway (written by hand, by an older version) is
quarantined on its own (see ``scheduler.quarantine``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field, Strict

from cronwheel.domain.errors import ValidationError

__all__ = [
    "BACKFILL_RATE_MAX",
    "BACKFILL_RATE_MIN",
    "CATCH_UP_WINDOW_MAX",
    "DELAY_MAX",
    "HEARTBEAT_TIMEOUT_MAX",
    "INSTANT_MAX",
    "INSTANT_MIN",
    "INTERVAL_MAX",
    "INTERVAL_MIN",
    "JSON_DEPTH_MAX",
    "LABEL_MAX",
    "NAME_MAX",
    "RESULT_DEPTH_MAX",
    "RETRY_AFTER_MAX",
    "RETRY_DELAY_MAX",
    "SPREAD_MAX",
    "TIMEOUT_MAX",
    "Flag",
    "Instant",
    "Integer",
    "Label",
    "Name",
    "Seconds",
    "check_instant",
    "check_json_tree",
    "check_text",
    "unstorable",
]

_DAY = 86400.0

INSTANT_MIN = datetime(1970, 1, 1, tzinfo=UTC)
# A year short of Python's last instant: room for any arithmetic a bounded duration
# does on a bounded instant.
INSTANT_MAX = datetime(9999, 1, 1, tzinfo=UTC)

DELAY_MAX = 10 * 366 * _DAY
INTERVAL_MIN = 1.0
INTERVAL_MAX = DELAY_MAX
RETRY_DELAY_MAX = 30 * _DAY
RETRY_AFTER_MAX = 7 * _DAY
TIMEOUT_MAX = 7 * _DAY
HEARTBEAT_TIMEOUT_MAX = 3600.0
CATCH_UP_WINDOW_MAX = 366 * _DAY
# A job's spread: each run fires somewhere in this long after its due instant. A day
# is as long as a run can sensibly be moved; longer is a different schedule.
SPREAD_MAX = _DAY
# Runs a second a backfill releases: its runs are spaced 1/rate seconds apart, so a rate
# near zero would space them past any instant (a tiny positive float made it infinite).
BACKFILL_RATE_MIN = 0.001
BACKFILL_RATE_MAX = 1000.0

NAME_MAX = 200  # job names, task names, worker names
LABEL_MAX = 100  # pools, tags, capabilities

JSON_DEPTH_MAX = 32
# A worker's result travels deepest: body > completions > item > result.
RESULT_DEPTH_MAX = JSON_DEPTH_MAX - 3


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def check_instant(value: datetime) -> datetime:
    """``value`` unchanged (its own offset kept) if, in UTC, it lies within
    ``[INSTANT_MIN, INSTANT_MAX]``; else ``ValueError`` saying the range."""
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # year 1 at +23:59, year 9999 at -23:59: no UTC form at all
        utc = None
    if utc is None or not INSTANT_MIN <= utc <= INSTANT_MAX:
        raise ValueError(
            f"{value.isoformat()} is out of range: instants lie between "
            f"{_iso(INSTANT_MIN)} and {_iso(INSTANT_MAX)}"
        )
    return value


def unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored by every backend (a NUL, an unpaired surrogate),
    or None when it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (\\ud800-\\udfff), which is not text"
    return None


def check_text(value: str) -> str:
    """A name-like string: storable and printable (no control characters)."""
    if value.isprintable():
        # NUL and the surrogates are not printable: a printable string is storable.
        return value
    problem = unstorable(value)
    if problem is None and not value.isprintable():
        problem = "contains a control or other non-printable character"
    if problem is not None:
        raise ValueError(problem)
    return value


def _instant_text(value: Any) -> Any:
    """Only text is an instant (or a datetime built in code): Pydantic would also take a
    number, or text that is one, as seconds since 1970, which the schema never says."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
    raise ValueError("write an ISO-8601 instant with an offset, e.g. 2030-01-31T09:30:00Z")


Instant = Annotated[AwareDatetime, BeforeValidator(_instant_text), AfterValidator(check_instant)]
"""An aware instant within the bounds, written as ISO-8601 text; keeps the offset it
was written with."""

# Strict: left lax, Pydantic takes `false` for 0, `true` for 1 and "2" for 2, so a
# typo'd or mistyped value is quietly read as another one.
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A finite number of seconds, a JSON number (each use adds its own range)."""

Integer = Annotated[int, Strict()]
"""A JSON integer written as one (2, not 2.0): not a boolean, not text."""

Flag = Annotated[bool, Strict()]
"""A JSON boolean: true or false, not 0, 1 or text."""

Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX), AfterValidator(check_text)]
"""A job, task or worker name."""

Label = Annotated[str, Field(min_length=1, max_length=LABEL_MAX), AfterValidator(check_text)]
"""A pool, tag or capability."""


def _path(parts: list[str | int]) -> str:
    return ".".join(str(p) for p in parts)


def _walk(value: Any, max_depth: int) -> Iterator[tuple[list[str | int], str]]:
    """Every problem in a parsed JSON value as ``(path, message)``: depth past
    ``max_depth``, unstorable strings (keys too), non-finite numbers."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list) and len(path) >= max_depth:
            yield path, f"nested deeper than {max_depth} levels"
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                problem = unstorable(key)
                if problem is not None:
                    yield [*path, key], f"the key {problem}"
                stack.append((child, [*path, key]))
        elif isinstance(item, list):
            stack.extend((child, [*path, i]) for i, child in enumerate(item))
        elif isinstance(item, str):
            problem = unstorable(item)
            if problem is not None:
                yield path, problem
        elif isinstance(item, float) and not math.isfinite(item):
            yield path, "is not a finite number (NaN and Infinity are not JSON)"


def check_json_tree(value: Any, *, max_depth: int = JSON_DEPTH_MAX, prefix: str = "") -> None:
    """Raise :class:`ValidationError` naming the first place where ``value`` (a parsed
    JSON document) is nested too deeply or holds what no backend can store."""
    for path, message in _walk(value, max_depth):
        field = _path(path)
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        # A deep path is cut: the message already says where it went wrong.
        shown = field if len(field) <= 200 else field[:197] + "..."
        raise ValidationError(f"{shown or 'body'}: {message}", field=shown or None)
