"""``cronwheel jobs edit``: change a job — its name, schedule, target or any field of
its runs' template — through ``PATCH /v1/jobs/{id}``, and print it as ``jobs show``
does.

The command reads the job first and sends its edit made from the version it read
(``If-Match``; ``--if-version`` names another), so a change made meanwhile is never
overwritten unseen: the edit is refused (412) and the command can be run again. What it
read lets its flags be gentler than the API, which replaces a field whole: a schedule
flag is laid over the job's schedule when it is of the same kind (``--tz`` alone moves
a cron job to another zone, its expression and policies kept; ``--cron`` keeps the
zone), and ``--max-attempts`` over its retry policy. ``--schedule-json`` and
``--payload`` replace the whole; ``--reset FIELD`` sets a field back to its default.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cronwheel.cli.jobs import IdArg, WebhookMethod, webhook_spec
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
from cronwheel.cli.output import console, handle_errors, key_values, print_json
from cronwheel.cli.schedule import Ambiguous, CatchUp, Nonexistent, Overlap, schedule_from_flags
from cronwheel.domain.job_edit import EDITABLE

__all__ = ["jobs_edit"]

_RECURRING = ("cron", "interval")
_POLICIES = ("catch_up", "catch_up_window", "overlap")
# Each schedule option's field, and the kinds of schedule it applies to.
_SCHEDULE_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--tz": ("timezone", ("cron",)),
    "--on-ambiguous": ("on_ambiguous", ("cron",)),
    "--on-nonexistent": ("on_nonexistent", ("cron",)),
    "--start": ("start", ("interval",)),
    "--catch-up": ("catch_up", _RECURRING),
    "--overlap": ("overlap", _RECURRING),
}


def _kind(schedule: dict[str, Any]) -> str:
    return next((k for k in ("at", "delay", "asap", "cron", "interval") if k in schedule), "")


def _edited_schedule(
    current: dict[str, Any],
    *,
    kind_flags: dict[str, Any],
    options: dict[str, Any],
    schedule_json: str | None,
) -> dict[str, Any] | None:
    """The schedule the flags make of ``current`` (None: they name none)."""
    given = {flag: value for flag, value in options.items() if value is not None}
    chosen = [flag for flag, value in kind_flags.items() if value not in (None, False)]
    if schedule_json is not None:
        if chosen or given:
            raise typer.BadParameter(
                "gives the whole schedule: no other schedule option goes with it",
                param_hint="'--schedule-json'",
            )
        return parse_json_object(schedule_json, "--schedule-json")
    if not chosen and not given:
        return None
    if chosen:
        fields = {_SCHEDULE_OPTIONS[flag][0]: value for flag, value in given.items()}
        schedule = schedule_from_flags(
            at=kind_flags["--at"],
            delay=kind_flags["--delay"],
            asap=kind_flags["--asap"],
            cron=kind_flags["--cron"],
            every=kind_flags["--every"],
            cron_options={k: fields.get(k) for k in ("timezone", "on_ambiguous", "on_nonexistent")},
            every_options={"start": fields.get("start")},
            recurring_options={k: fields.get(k) for k in ("catch_up", "overlap")},
        )
        old, new = _kind(current), _kind(schedule)
        if old == new and new in _RECURRING:
            return {**current, **schedule}  # the expression or interval, the rest kept
        if old in _RECURRING and new in _RECURRING:
            return {**{k: current[k] for k in _POLICIES if k in current}, **schedule}
        return schedule
    old = _kind(current)
    for flag in given:
        if old not in _SCHEDULE_OPTIONS[flag][1]:
            raise typer.BadParameter(
                f"does not apply to the job's schedule ({old}); give a new one with it",
                param_hint=f"'{flag}'",
            )
    return {**current, **{_SCHEDULE_OPTIONS[f][0]: v for f, v in given.items()}}


def _target(
    task: str | None, webhook: str | None, headers: list[str], method: WebhookMethod | None
) -> dict[str, Any]:
    """The target the flags switch the job to (the other one removed), if any."""
    if task is not None and webhook is not None:
        raise typer.BadParameter("give one of --task or --webhook", param_hint="the job's target")
    if webhook is None:
        for flag, given in (("--header", headers), ("--method", method)):
            if given:
                raise typer.BadParameter(
                    "applies with --webhook only: give the URL again with every header "
                    "(their values are write-only, never read back)",
                    param_hint=f"'{flag}'",
                )
        return {} if task is None else {"task": task, "webhook": None}
    return {"webhook": webhook_spec(webhook, headers, method), "task": None}


def _resets(names: list[str], fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        if name not in EDITABLE:
            raise typer.BadParameter(
                f"{name!r} is no field of a job: one of {', '.join(EDITABLE)}",
                param_hint="'--reset'",
            )
        if name in fields:
            raise typer.BadParameter(f"{name!r} is also given a value", param_hint="'--reset'")
        out[name] = None
    return out


def jobs_edit(
    job_id: IdArg,
    name: Annotated[
        str | None, typer.Option("--name", help="The job's new name.", show_default=False)
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task", help="Call this task instead (a webhook job's URL goes).", show_default=False
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            help="Call this URL instead (a task goes), with --header and --method.",
            show_default=False,
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            help="--webhook: a header NAME=VALUE (repeatable); the webhook's headers are "
            "these only.",
            show_default=False,
        ),
    ] = None,
    method: Annotated[
        WebhookMethod | None,
        typer.Option("--method", help="--webhook: the HTTP method.", show_default="POST"),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="One-off: run at this ISO-8601 instant.", show_default=False),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            "--delay", min=0, help="One-off: run this many seconds from now.", show_default=False
        ),
    ] = None,
    asap: Annotated[bool, typer.Option("--asap", help="One-off: run as soon as possible.")] = False,
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            help="Recurring: this cron expression (a cron job keeps its zone and policies).",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.001,
            help="Recurring: every this many seconds (counted from --start, else the epoch).",
            show_default=False,
        ),
    ] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="--cron: the IANA time zone.", show_default=False)
    ] = None,
    on_ambiguous: Annotated[
        Ambiguous | None,
        typer.Option(
            "--on-ambiguous", help="--cron: a wall time that occurs twice.", show_default=False
        ),
    ] = None,
    on_nonexistent: Annotated[
        Nonexistent | None,
        typer.Option("--on-nonexistent", help="--cron: a wall time DST skips.", show_default=False),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--start", help="--every: the instant intervals count from.", show_default=False
        ),
    ] = None,
    catch_up: Annotated[
        CatchUp | None,
        typer.Option(
            "--catch-up", help="Recurring: what becomes of missed occurrences.", show_default=False
        ),
    ] = None,
    overlap: Annotated[
        Overlap | None,
        typer.Option(
            "--overlap", help="Recurring: a run due while the last one runs.", show_default=False
        ),
    ] = None,
    schedule_json: Annotated[
        str | None,
        typer.Option(
            "--schedule-json",
            help='The whole schedule as a JSON object (e.g. \'{"cron": "0 6 * * *", '
            '"timezone": "Asia/Tokyo"}\').',
            show_default=False,
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="The whole payload: a JSON object.", show_default=False),
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="The worker pool.", show_default=False)
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", min=0, max=3, help="0 (P0) … 3.", show_default=False)
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="The job's tags are these (repeatable).", show_default=False),
    ] = None,
    route_tag: Annotated[
        list[str] | None,
        typer.Option(
            "--route-tag", help="Its route tags are these (repeatable).", show_default=False
        ),
    ] = None,
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require",
            help="Its required capabilities are these (repeatable).",
            show_default=False,
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            min=1,
            help="Tries before dead-letter (the rest of its retry policy kept).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Seconds an attempt may run.", show_default=False),
    ] = None,
    heartbeat_timeout: Annotated[
        float | None,
        typer.Option(
            "--heartbeat-timeout", help="Seconds a worker may go silent.", show_default=False
        ),
    ] = None,
    progress_timeout: Annotated[
        float | None,
        typer.Option(
            "--progress-timeout",
            help="Seconds a handler may go without reporting progress.",
            show_default=False,
        ),
    ] = None,
    spread: Annotated[
        float | None,
        typer.Option(
            "--spread",
            min=0,
            help="Seconds each run may fire after its due instant.",
            show_default=False,
        ),
    ] = None,
    lateness_budget: Annotated[
        float | None,
        typer.Option(
            "--lateness-budget",
            min=1,
            help="Seconds a run may go undispatched past its fire time before it counts as missed.",
            show_default=False,
        ),
    ] = None,
    reset: Annotated[
        list[str] | None,
        typer.Option(
            "--reset",
            help="Set this field back to its default, e.g. --reset tags (repeatable).",
            show_default=False,
        ),
    ] = None,
    if_version: Annotated[
        int | None,
        typer.Option(
            "--if-version",
            min=1,
            help="Edit only if the job is still this version (its 'version').",
            show_default="the version read",
        ),
    ] = None,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Edit a job: each option given replaces that part of it, the rest stays. Its
    pending run follows at once: a new schedule moves it to the next occurrence from
    now; a new template rewrites it; runs already dispatched keep what they had
    (docs/editing-jobs.md). A paused job stays paused."""
    fields: dict[str, Any] = {
        "name": name,
        "payload": None if payload is None else parse_json_object(payload, "--payload"),
        "pool": pool,
        "priority": priority,
        "tags": tag,
        "route_tags": route_tag,
        "requires": require,
        "timeout": timeout,
        "heartbeat_timeout": heartbeat_timeout,
        "progress_timeout": progress_timeout,
        "spread": spread,
        "lateness_budget": lateness_budget,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    fields.update(_target(task, webhook, header or [], method))
    kind_flags = {"--at": at, "--delay": delay, "--asap": asap, "--cron": cron, "--every": every}
    options = {
        "--tz": tz,
        "--on-ambiguous": None if on_ambiguous is None else on_ambiguous.value,
        "--on-nonexistent": None if on_nonexistent is None else on_nonexistent.value,
        "--start": None if start is None else parse_instant(start, "--start"),
        "--catch-up": None if catch_up is None else catch_up.value,
        "--overlap": None if overlap is None else overlap.value,
    }
    asked = [*kind_flags.values(), *options.values(), schedule_json, max_attempts, reset]
    if not fields and not any(v not in (None, False, []) for v in asked):
        raise typer.BadParameter("nothing to change: give at least one option")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        job = client.jobs.get(job_id)
        schedule = _edited_schedule(
            job["schedule"], kind_flags=kind_flags, options=options, schedule_json=schedule_json
        )
        if schedule is not None:
            fields["schedule"] = schedule
        if max_attempts is not None:
            fields["retry"] = {**job["retry"], "max_attempts": max_attempts}
        fields.update(_resets(reset or [], fields))
        edited = client.jobs.update(
            job_id,
            if_version=job["version"] if if_version is None else if_version,
            reason=reason,
            **fields,
        )
    if as_json:
        print_json(edited)
        return
    console.print(
        f"[green]edited[/] job [bold]{edited['id']}[/] ({edited['name']}): version "
        f"{edited['version']}",
        highlight=False,
    )
    console.print(key_values(f"job {edited['id']}", edited))
