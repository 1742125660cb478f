"""``cronwheel schedule preview`` (offline: the time engine, no server) and the recurring
side of ``cronwheel jobs``: pause, resume, trigger, backfill, preview."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from itertools import islice
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from cronwheel.cli_common import (
    DEFAULT_URL,
    ApiKeyOpt,
    JsonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    console,
    fail,
    handle_errors,
    print_json,
)
from cronwheel.domain.errors import CronwheelError
from cronwheel.domain.spec import CronSchedule, utc_iso
from cronwheel.timing import iter_occurrences

__all__ = [
    "Ambiguous",
    "CatchUp",
    "CountOpt",
    "IdArg",
    "Nonexistent",
    "Overlap",
    "ReasonOpt",
    "jobs_backfill",
    "jobs_pause",
    "jobs_preview",
    "jobs_resume",
    "jobs_trigger",
    "occurrence_table",
    "parse_instant",
    "parse_json_object",
    "register_job_controls",
    "schedule_app",
    "schedule_preview",
]

schedule_app = typer.Typer(
    help="Evaluate schedules offline (no server needed).", no_args_is_help=True
)


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


IdArg = Annotated[str, typer.Argument(help="The job id.")]
CountOpt = Annotated[
    int, typer.Option("--count", "-n", min=1, max=1000, help="How many occurrences.")
]
ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="Recorded in the history.", show_default=False)
]


def parse_instant(value: str, option: str) -> datetime:
    """An ISO-8601 instant with an offset (``Z`` for UTC), or a usage error naming
    ``option``."""
    try:
        instant = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO-8601 instant (e.g. 2030-01-31T09:00:00+01:00 or "
            "2030-01-31T08:00:00Z)",
            param_hint=f"'{option}'",
        ) from None
    if instant.tzinfo is None:
        raise typer.BadParameter(
            f"{value!r} has no UTC offset: add one (e.g. +01:00) or Z for UTC",
            param_hint=f"'{option}'",
        )
    return instant


def parse_json_object(value: str, option: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not valid JSON: {exc.msg} (at char {exc.pos})", param_hint=f"'{option}'"
        ) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(
            'must be a JSON object, e.g. \'{"region": "us"}\'', param_hint=f"'{option}'"
        )
    return parsed


def _offset(local: str) -> str:
    """The ``±HH:MM`` of a local ISO form; a skipped wall time has none."""
    tail = local[-6:]
    if local.endswith("Z"):
        return "+00:00"
    return tail if len(tail) == 6 and tail[0] in "+-" and tail[3] == ":" else "—"


def occurrence_table(title: str, items: list[dict[str, Any]]) -> Table:
    """Occurrences (``due_at``, ``due_local``, ``kind``, ``reason``) as a table: UTC and
    local instants side by side, the offset on its own so DST changes stand out."""
    out = Table(title=title, header_style="bold", expand=False)
    for name in ("#", "UTC", "local", "offset", "kind", "note"):
        out.add_column(name, overflow="fold")
    for index, item in enumerate(items, 1):
        kind = str(item.get("kind") or "normal")
        style = {"skipped": "red", "shifted": "yellow"}.get(
            kind, "cyan" if kind.startswith("ambiguous") else ""
        )
        local = str(item.get("due_local") or "")
        out.add_row(
            str(index),
            Text(str(item.get("due_at") or "")),
            Text(local),
            Text(_offset(local)),
            Text(kind, style=style),
            Text(str(item.get("reason") or "")),
        )
    return out


# -- offline -------------------------------------------------------------------------


@schedule_app.command("preview")
def schedule_preview(
    expr: Annotated[
        str, typer.Argument(help="A cron expression (5 fields, 6 with seconds, or @macro).")
    ],
    tz: Annotated[str, typer.Option("--tz", help="An IANA time zone.")] = "UTC",
    count: CountOpt = 10,
    start: Annotated[
        str | None,
        typer.Option(
            "--from", help="Start at this ISO-8601 instant [default: now].", show_default=False
        ),
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


# -- a job's control -----------------------------------------------------------------


def jobs_pause(
    job_id: IdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause a job: its runs are held until it is resumed; running ones finish."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.pause(job_id, reason=reason)
    if as_json:
        print_json(job)
        return
    console.print(f"[yellow]paused[/] job [bold]{job['id']}[/] ({job['name']})", highlight=False)


def jobs_resume(
    job_id: IdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a paused job: held runs are due again (missed ones at once, per its
    catch-up policy)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.resume(job_id, reason=reason)
    if as_json:
        print_json(job)
        return
    console.print(f"[green]resumed[/] job [bold]{job['id']}[/] ({job['name']})", highlight=False)


def jobs_trigger(
    job_id: IdArg,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload", help="A JSON object merged over the job's payload.", show_default=False
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a job now, outside its schedule."""
    merged = None if payload is None else parse_json_object(payload, "--payload")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.jobs.trigger(job_id, payload=merged)
    if as_json:
        print_json(run)
        return
    console.print(
        f"[green]triggered[/] run [bold]{run['id']}[/] of job {run['job_id']}, due {run['due_at']}",
        highlight=False,
    )


def jobs_backfill(
    job_id: IdArg,
    start: Annotated[
        str, typer.Option("--from", help="The start of the past range (ISO-8601, inclusive).")
    ],
    end: Annotated[
        str, typer.Option("--to", help="The end of the past range (ISO-8601, exclusive).")
    ],
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate", min=0.001, max=1000, show_default=False, help="Runs per second [10]."
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create runs for a recurring job's occurrences in a past range; occurrences that
    already have a run get none, so repeating it is harmless."""
    since, until = parse_instant(start, "--from"), parse_instant(end, "--to")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        made = client.jobs.backfill(job_id, start=since, end=until, rate=rate)
    if as_json:
        print_json(made)
        return
    console.print(f"[green]backfill[/]: {made['created']} runs created", highlight=False)


def jobs_preview(
    job_id: IdArg,
    count: CountOpt = 10,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A job's next due instants, UTC and local with their offsets."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        items = client.jobs.preview(job_id, count=count)
    if as_json:
        print_json({"items": items})
        return
    console.print(occurrence_table(f"job {job_id}", items))
    if not items:
        console.print("nothing due: the job is over", highlight=False)


def register_job_controls(app: typer.Typer) -> None:
    """Add the control commands to ``cronwheel jobs``."""
    app.command("pause")(jobs_pause)
    app.command("resume")(jobs_resume)
    app.command("trigger")(jobs_trigger)
    app.command("backfill")(jobs_backfill)
    app.command("preview")(jobs_preview)
