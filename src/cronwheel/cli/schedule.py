"""``cronwheel schedule preview``: a cron expression evaluated offline (the time engine,
no server); and what ``cronwheel jobs`` shares about schedules: the policies, the
schedule the flags of ``jobs create`` describe, a schedule in a few words, and the
occurrence table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from itertools import islice
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from cronwheel.cli.options import JsonOpt, parse_instant
from cronwheel.cli.output import command_group, console, fail, print_json, short_time
from cronwheel.domain.errors import CronwheelError
from cronwheel.domain.spec import CronSchedule, utc_iso
from cronwheel.timing import iter_occurrences

__all__ = [
    "Ambiguous",
    "CatchUp",
    "CountOpt",
    "Nonexistent",
    "Overlap",
    "occurrence_table",
    "schedule_app",
    "schedule_from_flags",
    "schedule_preview",
    "schedule_text",
]

schedule_app = command_group("Evaluate schedules offline (no server needed).")


class Ambiguous(StrEnum):
    first = "first"
    all = "all"


class Nonexistent(StrEnum):
    shift = "shift"
    skip = "skip"


class CatchUp(StrEnum):
    replay = "replay"
    coalesce = "coalesce"
    skip = "skip"


class Overlap(StrEnum):
    allow = "allow"
    skip = "skip"
    queue_one = "queue_one"
    cancel_previous = "cancel_previous"


CountOpt = Annotated[
    int, typer.Option("--count", "-n", min=1, max=1000, help="How many occurrences.")
]


def schedule_text(schedule: dict[str, Any]) -> str:
    """A job's schedule in a few words, for tables."""
    for key in ("at", "delay", "asap", "cron", "interval"):
        if key in schedule:
            value = schedule[key]
            if key == "asap":
                return "asap"
            if key == "cron":
                return f"cron {value} {schedule.get('timezone', 'UTC')}"
            if key in ("delay", "interval"):
                return f"{key} {value:g} s" if isinstance(value, int | float) else f"{key} {value}"
            return f"at {short_time(value)}"
    return json.dumps(schedule)


_OPTION_NAMES = {
    "timezone": "--tz",
    "on_ambiguous": "--on-ambiguous",
    "on_nonexistent": "--on-nonexistent",
    "start": "--start",
    "catch_up": "--catch-up",
    "overlap": "--overlap",
}


def schedule_from_flags(
    *,
    at: str | None,
    delay: float | None,
    asap: bool,
    cron: str | None,
    every: float | None,
    cron_options: dict[str, Any],
    every_options: dict[str, Any],
    recurring_options: dict[str, Any],
) -> dict[str, Any]:
    """The schedule the flags describe; a usage error when they do not fit together."""
    chosen = [
        flag
        for flag, given in (
            ("--at", at is not None),
            ("--delay", delay is not None),
            ("--asap", asap),
            ("--cron", cron is not None),
            ("--every", every is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --at, --delay, --asap, --cron, --every"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
            param_hint="the schedule",
        )
    allowed: dict[str, Any] = {}
    if cron is not None:
        allowed = {**cron_options, **recurring_options}
    elif every is not None:
        allowed = {**every_options, **recurring_options}
    for options in (cron_options, every_options, recurring_options):
        for key, value in options.items():
            if value is not None and key not in allowed:
                raise typer.BadParameter(
                    f"{_OPTION_NAMES[key]} does not apply to {chosen[0]}",
                    param_hint=f"'{_OPTION_NAMES[key]}'",
                )
    extra = {k: v for k, v in allowed.items() if v is not None}
    if at is not None:
        return {"at": parse_instant(at, "--at")}
    if delay is not None:
        return {"delay": delay}
    if cron is not None:
        return {"cron": cron, **extra}
    if every is not None:
        return {"interval": every, **extra}
    return {"asap": True}


def _offset(local: str) -> str:
    """The ``±HH:MM`` of a local ISO form; a skipped wall time has none."""
    tail = local[-6:]
    if local.endswith("Z"):
        return "+00:00"
    return tail if len(tail) == 6 and tail[0] in "+-" and tail[3] == ":" else "—"


def occurrence_table(title: str, items: list[dict[str, Any]]) -> Table:
    """Occurrences (``due_at``, ``due_local``, ``kind``, ``reason``) as a table: UTC and
    local instants side by side, the offset on its own so DST changes stand out. Items
    with ``fire_at`` (a job's preview) show it too: when each run fires, its spread
    instant."""
    fires = any("fire_at" in item for item in items)
    out = Table(title=title, header_style="bold", expand=False)
    for name in ("#", "UTC", *(("fires (UTC)",) if fires else ()), "local", "offset", "kind"):
        out.add_column(name, overflow="fold")
    out.add_column("note", overflow="fold")
    for index, item in enumerate(items, 1):
        kind = str(item.get("kind") or "normal")
        style = {"skipped": "red", "shifted": "yellow"}.get(
            kind, "cyan" if kind.startswith("ambiguous") else ""
        )
        local = str(item.get("due_local") or "")
        out.add_row(
            str(index),
            Text(str(item.get("due_at") or "")),
            *((Text(str(item.get("fire_at") or "")),) if fires else ()),
            Text(local),
            Text(_offset(local)),
            Text(kind, style=style),
            Text(str(item.get("reason") or "")),
        )
    return out


@schedule_app.command("preview")
def schedule_preview(
    expr: Annotated[
        str, typer.Argument(help="A cron expression (5 fields, 6 with seconds, or @macro).")
    ],
    tz: Annotated[str, typer.Option("--tz", help="An IANA time zone.")] = "UTC",
    count: CountOpt = 10,
    start: Annotated[
        str | None,
        typer.Option("--from", help="Start at this ISO-8601 instant.", show_default="now"),
    ] = None,
    on_ambiguous: Annotated[
        Ambiguous, typer.Option("--on-ambiguous", help="A wall time that occurs twice.")
    ] = Ambiguous.first,
    on_nonexistent: Annotated[
        Nonexistent, typer.Option("--on-nonexistent", help="A wall time that does not occur.")
    ] = Nonexistent.shift,
    as_json: JsonOpt = False,
) -> None:
    """The next occurrences of a cron expression in a time zone, UTC and local with
    their offsets, as cronwheel will fire them (DST policies included). No server."""
    since = datetime.now(UTC) if start is None else parse_instant(start, "--from")
    try:
        schedule = CronSchedule(
            cron=expr,
            timezone=tz,
            on_ambiguous=on_ambiguous.value,
            on_nonexistent=on_nonexistent.value,
        )
        found = list(islice(iter_occurrences(schedule, since, include_skipped=True), count))
    except CronwheelError as exc:
        option = {"schedule.cron": "EXPR", "schedule.timezone": "--tz"}.get(exc.field or "")
        fail(f"{option}: {exc.message}" if option else exc.message)
    items = [
        {"due_at": utc_iso(o.utc), "due_local": o.local, "kind": o.kind, "reason": o.reason}
        for o in found
    ]
    if as_json:
        print_json(items)
        return
    console.print(occurrence_table(f"{expr} in {tz}", items))
    if not items:
        console.print("no occurrence", highlight=False)
