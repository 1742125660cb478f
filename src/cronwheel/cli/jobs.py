"""``cronwheel jobs …``: create, list, show and cancel jobs; pause, resume, trigger,
backfill and preview them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from cronwheel.cli.options import (
    DEFAULT_URL,
    ApiKeyOpt,
    JsonOpt,
    ReasonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    parse_instant,
    parse_json_object,
)
from cronwheel.cli.output import console, handle_errors, key_values, print_json, short_time, table
from cronwheel.cli.schedule import (
    Ambiguous,
    CatchUp,
    CountOpt,
    Nonexistent,
    Overlap,
    occurrence_table,
)

__all__ = [
    "IdArg",
    "jobs_app",
    "jobs_backfill",
    "jobs_cancel",
    "jobs_create",
    "jobs_list",
    "jobs_pause",
    "jobs_preview",
    "jobs_resume",
    "jobs_show",
    "jobs_trigger",
]

jobs_app = typer.Typer(
    help="Create, list, preview and control jobs (cancel, pause, resume, trigger, backfill).",
    no_args_is_help=True,
)

IdArg = Annotated[str, typer.Argument(help="The job id.")]


def _instant(value: str | None, option: str = "--at") -> datetime | None:
    return None if value is None else parse_instant(value, option)


def _payload(value: str | None) -> dict[str, Any]:
    return {} if value is None else parse_json_object(value, "--payload")


def _schedule_text(schedule: dict[str, Any]) -> str:
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


def _schedule(
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
        return {"at": _instant(at)}
    if delay is not None:
        return {"delay": delay}
    if cron is not None:
        return {"cron": cron, **extra}
    if every is not None:
        return {"interval": every, **extra}
    return {"asap": True}


@jobs_app.command("create")
def jobs_create(
    name: Annotated[str, typer.Option("--name", help="The job's name.")],
    task: Annotated[str, typer.Option("--task", help="The task name a worker implements.")],
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help="Run once at this ISO-8601 instant (with an offset).", show_default=False
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            "--delay", min=0, show_default=False, help="Run once after this many seconds."
        ),
    ] = None,
    asap: Annotated[bool, typer.Option("--asap", help="Run once, as soon as possible.")] = False,
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            help="Recurring: a cron expression (5 fields, 6 with seconds, or @hourly …).",
            show_default=False,
        ),
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option(
            "--tz", help="The IANA time zone of --cron [default: UTC].", show_default=False
        ),
    ] = None,
    on_ambiguous: Annotated[
        Ambiguous | None,
        typer.Option(
            "--on-ambiguous",
            help="--cron: a wall time that occurs twice fires once or at both [first].",
            show_default=False,
        ),
    ] = None,
    on_nonexistent: Annotated[
        Nonexistent | None,
        typer.Option(
            "--on-nonexistent",
            help="--cron: a wall time skipped by DST fires after the gap or not [shift].",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.001,
            show_default=False,
            help="Recurring: every this many seconds of elapsed time.",
        ),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--start", help="--every: counted from this instant [the epoch].", show_default=False
        ),
    ] = None,
    catch_up: Annotated[
        CatchUp | None,
        typer.Option(
            "--catch-up",
            help="Recurring: what becomes of occurrences missed while down [coalesce].",
            show_default=False,
        ),
    ] = None,
    overlap: Annotated[
        Overlap | None,
        typer.Option(
            "--overlap",
            help="Recurring: a run due while the previous one still runs [allow].",
            show_default=False,
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="A JSON object handed to the handler.", show_default=False),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="The worker pool (default: default).", show_default=False),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", min=0, max=3, show_default=False, help="0 (P0, highest) … 3."),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="A tag to find the job by (repeatable).", show_default=False),
    ] = None,
    route_tag: Annotated[
        list[str] | None,
        typer.Option(
            "--route-tag",
            help="An execution tag the worker must carry to lease the runs (repeatable).",
            show_default=False,
        ),
    ] = None,
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require", help="A capability the worker must have (repeatable).", show_default=False
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", min=1, show_default=False, help="Tries before dead-letter."),
    ] = None,
    progress_timeout: Annotated[
        float | None,
        typer.Option(
            "--progress-timeout",
            show_default=False,
            help="Seconds a handler may go without reporting progress (ctx.heartbeat) "
            "before its attempt times out [no bound].",
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Makes a repeated command return the same job.",
            show_default=False,
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a job: one-off (--at, --delay, --asap) or recurring (--cron with --tz,
    or --every); exactly one of them."""
    schedule = _schedule(
        at=at,
        delay=delay,
        asap=asap,
        cron=cron,
        every=every,
        cron_options={
            "timezone": tz,
            "on_ambiguous": on_ambiguous,
            "on_nonexistent": on_nonexistent,
        },
        every_options={"start": _instant(start, "--start")},
        recurring_options={"catch_up": catch_up, "overlap": overlap},
    )
    fields: dict[str, Any] = {
        "payload": _payload(payload),
        "pool": pool,
        "priority": priority,
        "tags": tag or None,
        "route_tags": route_tag or None,
        "requires": require or None,
        "retry": {"max_attempts": max_attempts} if max_attempts is not None else None,
        "progress_timeout": progress_timeout,
    }
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.create(
            name=name, schedule=schedule, task=task, idempotency_key=idempotency_key, **fields
        )
    if as_json:
        print_json(job)
        return
    console.print(
        f"[green]created[/] job [bold]{job['id']}[/] ({job['name']}), "
        f"next due {short_time(job.get('next_due_at')) or '—'}",
        highlight=False,
    )
    if job.get("first_run_id"):
        console.print(f"run {job['first_run_id']}", highlight=False)


@jobs_app.command("list")
def jobs_list(
    state: Annotated[
        str | None,
        typer.Option("--state", help="active | paused | cancelled | finished", show_default=False),
    ] = None,
    tag: Annotated[str | None, typer.Option("--tag", show_default=False)] = None,
    name_prefix: Annotated[str | None, typer.Option("--name-prefix", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", help="next_cursor of a previous page.", show_default=False),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Jobs, newest first."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.jobs.list(
            state=state, tag=tag, name_prefix=name_prefix, limit=limit, cursor=cursor
        )
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            j["id"],
            j["name"],
            j["state"],
            _schedule_text(j.get("schedule") or {}),
            j.get("task") or "webhook",
            j.get("pool"),
            f"P{j.get('priority', '')}",
            short_time(j.get("next_due_at")),
        )
        for j in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"jobs ({len(rows)})",
            ["id", "name", "state", "schedule", "task", "pool", "prio", "next due"],
            rows,
            caption=caption,
        )
    )


@jobs_app.command("show")
def jobs_show(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.get(job_id)
    if as_json:
        print_json(job)
        return
    console.print(key_values(f"job {job['id']}", job))


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    reason: Annotated[
        str | None, typer.Option("--reason", help="Recorded in the history.", show_default=False)
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: it fires no more; pending runs are cancelled, running ones asked to stop."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.cancel(job_id, reason=reason)
    if as_json:
        print_json(job)
        return
    console.print(f"[yellow]cancelled[/] job [bold]{job['id']}[/] ({job['name']})", highlight=False)


# -- a job's control -----------------------------------------------------------------


@jobs_app.command("pause")
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


@jobs_app.command("resume")
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


@jobs_app.command("trigger")
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


@jobs_app.command("backfill")
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


@jobs_app.command("preview")
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
