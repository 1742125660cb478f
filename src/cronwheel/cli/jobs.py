"""``cronwheel jobs …``: create (a task or a webhook), list, show, cancel and delete
jobs; pause, resume, trigger, backfill and preview them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from cronwheel.cli.options import (
    DEFAULT_URL,
    ApiKeyOpt,
    CursorOpt,
    JsonOpt,
    ReasonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    parse_instant,
    parse_json_object,
)
from cronwheel.cli.output import (
    command_group,
    console,
    count,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)
from cronwheel.cli.schedule import (
    Ambiguous,
    CatchUp,
    CountOpt,
    Nonexistent,
    Overlap,
    occurrence_table,
    schedule_from_flags,
    schedule_text,
)

__all__ = [
    "IdArg",
    "WebhookMethod",
    "jobs_app",
    "jobs_backfill",
    "jobs_cancel",
    "jobs_create",
    "jobs_delete",
    "jobs_list",
    "jobs_pause",
    "jobs_preview",
    "jobs_resume",
    "jobs_show",
    "jobs_trigger",
    "webhook_spec",
]

jobs_app = command_group(
    "Create, list, preview, edit and control jobs (cancel, pause, resume, trigger, backfill, "
    "delete)."
)

IdArg = Annotated[str, typer.Argument(help="The job id.")]


def _instant(value: str | None, option: str = "--at") -> datetime | None:
    return None if value is None else parse_instant(value, option)


def _payload(value: str | None) -> dict[str, Any]:
    return {} if value is None else parse_json_object(value, "--payload")


class WebhookMethod(StrEnum):
    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


def _target(
    task: str | None, webhook: str | None, headers: list[str], method: WebhookMethod | None
) -> dict[str, Any]:
    """``task`` or ``webhook`` of the job the flags describe; a usage error when they
    do not fit together."""
    if (task is None) == (webhook is None):
        raise typer.BadParameter(
            "give exactly one of --task or --webhook", param_hint="the job's target"
        )
    if webhook is None:
        for flag, given in (("--header", headers), ("--method", method)):
            if given:
                raise typer.BadParameter("applies to --webhook only", param_hint=f"'{flag}'")
        return {"task": task}
    return {"webhook": webhook_spec(webhook, headers, method)}


def webhook_spec(url: str, headers: list[str], method: WebhookMethod | None) -> dict[str, Any]:
    """The webhook ``--webhook``, ``--header`` (NAME=VALUE each) and ``--method``
    describe; a usage error for a header that is not NAME=VALUE."""
    named: dict[str, str] = {}
    for item in headers:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(
                f"{item!r} is not NAME=VALUE (e.g. Authorization=Bearer …)", param_hint="'--header'"
            )
        named[name.strip()] = value
    spec: dict[str, Any] = {"url": url, "headers": named}
    if method is not None:
        spec["method"] = method.value
    return spec


@jobs_app.command("create")
def jobs_create(
    name: Annotated[str, typer.Option("--name", help="The job's name.")],
    task: Annotated[
        str | None,
        typer.Option("--task", help="The task name a worker implements.", show_default=False),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            help="Instead of --task: the URL the built-in webhook worker calls for each run "
            "(the payload is the JSON body; see docs/webhooks.md).",
            show_default=False,
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            help="--webhook: a header NAME=VALUE sent with each call (repeatable); values "
            "are write-only: answers show them as [redacted].",
            show_default=False,
        ),
    ] = None,
    method: Annotated[
        WebhookMethod | None,
        typer.Option("--method", help="--webhook: the HTTP method.", show_default="POST"),
    ] = None,
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
        typer.Option("--tz", help="The IANA time zone of --cron.", show_default="UTC"),
    ] = None,
    on_ambiguous: Annotated[
        Ambiguous | None,
        typer.Option(
            "--on-ambiguous",
            help="--cron: a wall time that occurs twice fires once or at both.",
            show_default="first",
        ),
    ] = None,
    on_nonexistent: Annotated[
        Nonexistent | None,
        typer.Option(
            "--on-nonexistent",
            help="--cron: a wall time skipped by DST fires after the gap or not.",
            show_default="shift",
        ),
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.001,
            show_default=False,
            help="Recurring: every this many seconds of elapsed time, counted from --start: "
            "without it, from the Unix epoch (1970-01-01T00:00:00Z), so --every 60 fires at "
            "each minute's start and --every 3600 on the hour, UTC.",
        ),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--start",
            help="--every: the instant (ISO-8601 with an offset) the intervals are counted "
            "from: the first run is due then (or, if it has passed, at the next interval "
            "counted from it), the next ones every --every seconds after.",
            show_default="the Unix epoch",
        ),
    ] = None,
    catch_up: Annotated[
        CatchUp | None,
        typer.Option(
            "--catch-up",
            help="Recurring: what becomes of occurrences missed while down.",
            show_default="coalesce",
        ),
    ] = None,
    overlap: Annotated[
        Overlap | None,
        typer.Option(
            "--overlap",
            help="Recurring: a run due while the previous one still runs.",
            show_default="allow",
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="A JSON object handed to the handler.", show_default=False),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="The worker pool.", show_default="default"),
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
            show_default="no bound",
            help="Seconds a handler may go without reporting progress (ctx.heartbeat) "
            "before its attempt times out.",
        ),
    ] = None,
    spread: Annotated[
        float | None,
        typer.Option(
            "--spread",
            min=0,
            show_default="0: at the due instant",
            help="Seconds (at most a day; for --cron or --every, shorter than the schedule's "
            "shortest interval): each run fires at a fixed offset in that window after its "
            "due instant, derived from the job and the occurrence (docs/spread.md).",
        ),
    ] = None,
    lateness_budget: Annotated[
        float | None,
        typer.Option(
            "--lateness-budget",
            min=1,
            show_default="30",
            help="Seconds a run may go undispatched past its fire time before it counts "
            "as missed (an alert; docs/alerts.md).",
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
    or --every with --start); exactly one of them. Its runs call a task (--task) or a
    URL (--webhook, with --header and --method); exactly one of them."""
    target = _target(task, webhook, header or [], method)
    schedule = schedule_from_flags(
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
        "spread": spread,
        "lateness_budget": lateness_budget,
    }
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.create(
            name=name, schedule=schedule, idempotency_key=idempotency_key, **target, **fields
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
    cursor: CursorOpt = None,
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
            schedule_text(j.get("schedule") or {}),
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
    reason: ReasonOpt = None,
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


@jobs_app.command("delete")
def jobs_delete(
    job_id: IdArg,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Also end its runs in progress (otherwise the deletion is refused)."
        ),
    ] = False,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a job with its runs and their history and logs. Refused while a run of it
    is dispatched or running, unless --force ends them. A cancelled job's history stays
    until it is deleted; the deletion itself stays in the audit trail."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        out = client.jobs.delete(job_id, force=force, reason=reason)
    if as_json:
        print_json(out)
        return
    stopped = out.get("runs_stopped") or []
    ended = f", {len(stopped)} of them in progress" if stopped else ""
    console.print(
        f"[red]deleted[/] job [bold]{out['id']}[/] ({out['name']}) with "
        f"{count(out['runs_deleted'], 'run')}{ended}",
        highlight=False,
    )


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
        typer.Option("--rate", min=0.001, max=1000, show_default="10", help="Runs per second."),
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
    """A job's next due instants, UTC and local with their offsets, and when each run
    fires (its spread instant)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        items = client.jobs.preview(job_id, count=count)
    if as_json:
        print_json({"items": items})
        return
    console.print(occurrence_table(f"job {job_id}", items))
    if not items:
        console.print("nothing due: the job is over", highlight=False)
