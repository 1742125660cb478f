"""``cronwheel jobs …``, ``cronwheel runs …`` and ``cronwheel tenants …``: the API
from the command line (the control of recurring jobs is in ``cli_schedule``)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.text import Text

from cronwheel.cli_common import (
    DEFAULT_URL,
    ApiKeyOpt,
    JsonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    console,
    err,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)
from cronwheel.cli_schedule import (
    Ambiguous,
    CatchUp,
    Nonexistent,
    Overlap,
    parse_instant,
    parse_json_object,
    register_job_controls,
)
from cronwheel.domain.states import TERMINAL_STATES

__all__ = [
    "jobs_app",
    "jobs_cancel",
    "jobs_create",
    "jobs_list",
    "jobs_show",
    "runs_app",
    "runs_cancel",
    "runs_list",
    "runs_logs",
    "runs_show",
    "tenants_app",
    "tenants_create",
    "tenants_create_key",
    "tenants_list",
]

jobs_app = typer.Typer(
    help="Create, list, preview and control jobs (cancel, pause, resume, trigger, backfill).",
    no_args_is_help=True,
)
runs_app = typer.Typer(
    help="Run history: list runs, show one with its attempts and events, read its logs.",
    no_args_is_help=True,
)
tenants_app = typer.Typer(help="Tenants and their keys (admin key).", no_args_is_help=True)


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


# -- jobs ----------------------------------------------------------------------------

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
        list[str] | None, typer.Option("--tag", help="A tag (repeatable).", show_default=False)
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


register_job_controls(jobs_app)


# -- runs ----------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    job_id: Annotated[str | None, typer.Option("--job-id", show_default=False)] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            help="A run state, or several separated by commas (e.g. FAILED,DEAD_LETTER).",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", show_default=False)] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Runs, newest first."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.runs.list(job_id=job_id, state=state, limit=limit, cursor=cursor)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            r["id"],
            r.get("job_name") or r["job_id"],
            r["state"],
            short_time(r.get("due_at")),
            f"{r.get('attempt', 0)}/{r.get('max_attempts', '?')}",
            r.get("task") or "webhook",
            short_time(r.get("finished_at")),
        )
        for r in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"runs ({len(rows)})",
            ["id", "job", "state", "due", "attempt", "task", "finished"],
            rows,
            caption=caption,
        )
    )


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One run, its attempts and its events."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.runs.get(run_id)
    if as_json:
        print_json(run)
        return
    attempts = run.pop("attempts", []) or []
    events = run.pop("events", []) or []
    run.pop("events_next_cursor", None)
    console.print(key_values(f"run {run['id']}", run))
    console.print(
        table(
            "attempts",
            ["#", "id", "state", "worker", "token", "started", "finished", "error"],
            [
                (
                    a.get("number"),
                    a.get("id"),
                    a.get("state"),
                    a.get("worker_id"),
                    a.get("fencing_token"),
                    short_time(a.get("started_at")),
                    short_time(a.get("finished_at")),
                    (a.get("error") or "").split("\n", 1)[0],
                )
                for a in attempts
            ],
        )
    )
    console.print(
        table(
            "events",
            ["at", "kind", "from", "to", "actor", "reason"],
            [
                (
                    short_time(e.get("at")),
                    e.get("kind"),
                    e.get("from_state"),
                    e.get("to_state"),
                    e.get("actor"),
                    e.get("reason"),
                )
                for e in events
            ],
        )
    )


@runs_app.command("cancel")
def runs_cancel(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    reason: Annotated[str | None, typer.Option("--reason", show_default=False)] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel one run (a running one is asked to stop on its next heartbeat)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.runs.cancel(run_id, reason=reason)
    if as_json:
        print_json(run)
        return
    console.print(f"run [bold]{run['id']}[/] is {run['state']}", highlight=False)


_LEVEL_STYLES = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red", "DEBUG": "dim"}
_FINAL_STATES = frozenset(s.value for s in TERMINAL_STATES)


def _print_line(line: dict[str, Any], *, as_json: bool) -> None:
    if as_json:  # one JSON object a line, to pipe into jq
        console.print(json.dumps(line), markup=False, highlight=False)
        return
    level = str(line.get("level", ""))
    console.print(
        Text.assemble(
            (short_time(line.get("ts")), "dim"),
            f"  #{line.get('attempt')}  ",
            (f"{level:<8}", _LEVEL_STYLES.get(level, "")),
            " ",
            str(line.get("message", "")),
        ),
        highlight=False,
    )


@runs_app.command("logs")
def runs_logs(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    attempt: Annotated[
        int | None,
        typer.Option("--attempt", min=1, help="Only this attempt's lines.", show_default=False),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new lines until the run is over."),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between polls with --follow.")
    ] = 1.0,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The lines the run's handlers wrote with ctx.log, oldest first: time, attempt,
    level and message (--json: one JSON object a line)."""
    printed = 0
    try:
        with handle_errors(), client_for(url, api_key, tenant) as client:
            cursor: str | None = None
            while True:
                page = client.runs.logs_page(run_id, attempt=attempt, cursor=cursor)
                for line in page.get("lines") or []:
                    _print_line(line, as_json=as_json)
                    printed += 1
                if page.get("next_cursor"):
                    cursor = page["next_cursor"]
                    continue
                # The state was read before the lines: once final, nothing comes later.
                if not follow or page.get("run_state") in _FINAL_STATES:
                    break
                cursor = page.get("end_cursor") or cursor
                time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if not printed and not as_json:
        err.print(f"run {run_id} has no log lines", highlight=False, markup=False)


# -- tenants -------------------------------------------------------------------------


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant; prints its first operator key (shown once)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        tenant = client.tenants.create(name)
    if as_json:
        print_json(tenant)
        return
    console.print(
        f"[green]created[/] tenant [bold]{tenant['id']}[/] ({tenant['name']})", highlight=False
    )
    if tenant.get("api_key"):
        console.print(f"operator key (shown once): {tenant['api_key']}", highlight=False)


@tenants_app.command("list")
def tenants_list(
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 100,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Tenants."""
    with handle_errors(), client_for(url, api_key, None) as client:
        page = client.tenants.list(limit=limit)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (t["id"], t["name"], json.dumps(t.get("limits") or {}), short_time(t.get("created_at")))
        for t in page.items
    ]
    console.print(table(f"tenants ({len(rows)})", ["id", "name", "limits", "created"], rows))


@tenants_app.command("create-key")
def tenants_create_key(
    tenant_id: Annotated[str, typer.Argument(help="The tenant id.")],
    role: Annotated[str, typer.Option("--role", help="operator | viewer | worker")] = "operator",
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new key for a tenant (shown once)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        key = client.tenants.create_key(tenant_id, role=role)
    if as_json:
        print_json(key)
        return
    console.print(f"{key.get('role', role)} key (shown once): {key['api_key']}", highlight=False)
