"""``cronwheel dlq``: dead letters — runs that gave up after their last attempt — listed,
shown and redriven; ``cronwheel runs retry`` sends any failed run back."""

from __future__ import annotations

from typing import Annotated

import typer

from cronwheel.cli_common import (
    DEFAULT_URL,
    ApiKeyOpt,
    JsonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    console,
    handle_errors,
    print_json,
    short_time,
    table,
)
from cronwheel.cli_resources import runs_app, runs_show

__all__ = ["ReasonOpt", "RunArg", "dlq_app", "dlq_list", "dlq_redrive", "runs_retry"]

dlq_app = typer.Typer(help="Dead letters: list, show, redrive.", no_args_is_help=True)

RunArg = Annotated[str, typer.Argument(help="The run id.")]
ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="Recorded in the history.", show_default=False)
]


@dlq_app.command("list")
def dlq_list(
    job_id: Annotated[str | None, typer.Option("--job-id", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", show_default=False)] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dead-lettered runs, newest first, with their last error."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.runs.dead_letters(job_id=job_id, limit=limit, cursor=cursor)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            r["id"],
            r.get("job_name") or r["job_id"],
            short_time(r.get("due_at")),
            f"{r.get('attempt', 0)}/{r.get('max_attempts', '?')}",
            (r.get("last_error") or "").split("\n", 1)[0],
            short_time(r.get("finished_at")),
        )
        for r in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"dead letters ({len(rows)})",
            ["id", "job", "due", "attempts", "last error", "dead since"],
            rows,
            caption=caption,
        )
    )


dlq_app.command("show", help="One dead letter: the run, its attempts and its events.")(runs_show)


def _send_back(
    run_id: str,
    action: str,
    reason: str | None,
    url: str,
    api_key: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    with handle_errors(), client_for(url, api_key, tenant) as client:
        send = client.runs.redrive if action == "redrive" else client.runs.retry
        run = send(run_id, reason=reason)
    if as_json:
        print_json(run)
        return
    console.print(f"run [bold]{run['id']}[/] is {run['state']} again", highlight=False)


@dlq_app.command("redrive")
def dlq_redrive(
    run_id: RunArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a dead letter back for a new series of attempts."""
    _send_back(run_id, "redrive", reason, url, api_key, tenant, as_json)


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
    _send_back(run_id, "retry", reason, url, api_key, tenant, as_json)
