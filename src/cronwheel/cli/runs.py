"""``cronwheel runs …``: list runs, show one with its attempts and events, read its
logs, cancel it or send it back for another try."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.text import Text

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
)
from cronwheel.cli.output import (
    command_group,
    console,
    err,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)
from cronwheel.domain.states import TERMINAL_STATES

__all__ = [
    "RunArg",
    "runs_app",
    "runs_cancel",
    "runs_events",
    "runs_list",
    "runs_logs",
    "runs_retry",
    "runs_show",
    "send_back",
]

runs_app = command_group(
    "Run history: list runs, show one with its attempts and events, read its logs."
)

RunArg = Annotated[str, typer.Argument(help="The run id.")]


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
    since: Annotated[
        str | None,
        typer.Option("--since", help="Due at or after (ISO-8601 with offset).", show_default=False),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Due before (ISO-8601 with offset).", show_default=False),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="Carrying this tag (repeat: every one).", show_default=False),
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Runs, newest first by due time. The admin key without --tenant lists every
    tenant's. The next page: the --cursor the caption shows."""
    start = None if since is None else parse_instant(since, "--since")
    end = None if until is None else parse_instant(until, "--until")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.runs.list(
            job_id=job_id,
            state=state,
            since=start,
            until=end,
            tag=tag or None,
            pool=pool,
            limit=limit,
            cursor=cursor,
        )
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
            r.get("pool") or "",
            r.get("task") or "webhook",
            short_time(r.get("finished_at")),
        )
        for r in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"runs ({len(rows)})",
            ["id", "job", "state", "due", "attempt", "pool", "task", "finished"],
            rows,
            caption=caption,
        )
    )


def _events_table(title: str, events: list[dict[str, Any]], caption: str | None = None) -> Any:
    return table(
        title,
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
        caption=caption,
    )


@runs_app.command("events")
def runs_events(
    run_id: RunArg,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 100,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The run's event timeline, oldest first, a page at a time."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.runs.events(run_id, cursor=cursor, limit=limit)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(_events_table(f"events ({len(page.items)})", page.items, caption))


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
            ["#", "id", "state", "worker", "started", "finished", "ms", "error"],
            [
                (
                    a.get("number"),
                    a.get("id"),
                    a.get("state"),
                    a.get("worker_name") or a.get("worker_id"),
                    short_time(a.get("started_at")),
                    short_time(a.get("finished_at")),
                    a.get("duration_ms"),
                    (a.get("error") or "").split("\n", 1)[0],
                )
                for a in attempts
            ],
            caption="logs: cronwheel runs logs RUN [--attempt N]" if attempts else None,
        )
    )
    console.print(_events_table("events", events))


@runs_app.command("cancel")
def runs_cancel(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    reason: ReasonOpt = None,
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


def send_back(
    run_id: str,
    action: str,
    reason: str | None,
    url: str,
    api_key: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Send one run back (``action``: ``redrive`` a dead letter, or ``retry`` any failed
    run) and print its new state: ``runs retry``, and ``dlq redrive`` of a single run."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        send = client.runs.redrive if action == "redrive" else client.runs.retry
        run = send(run_id, reason=reason)
    if as_json:
        print_json(run)
        return
    console.print(f"run [bold]{run['id']}[/] is {run['state']} again", highlight=False)


@runs_app.command("retry")
def runs_retry(
    run_id: RunArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a failed, cancelled or dead-lettered run again."""
    send_back(run_id, "retry", reason, url, api_key, tenant, as_json)
