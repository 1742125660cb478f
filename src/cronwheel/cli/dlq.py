"""``cronwheel dlq``: dead letters — runs that gave up after their last attempt — listed,
shown and redriven (``cronwheel runs retry``, beside the other run commands, sends any
failed run back)."""

from __future__ import annotations

import sys
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
)
from cronwheel.cli.output import (
    command_group,
    console,
    fail,
    handle_errors,
    print_json,
    short_time,
    table,
)
from cronwheel.cli.runs import runs_show, send_back
from cronwheel.store.values import REDRIVE_BATCH_MAX

__all__ = ["dlq_app", "dlq_list", "dlq_redrive"]

dlq_app = command_group("Dead letters: list, show, redrive.")


@dlq_app.command("list")
def dlq_list(
    job_id: Annotated[str | None, typer.Option("--job-id", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: CursorOpt = None,
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


@dlq_app.command("redrive")
def dlq_redrive(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="RUN_ID", help="One run, or several in one batch.", show_default=False
        ),
    ] = None,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job", "--job-id", help="Every dead letter of this job.", show_default=False
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every dead letter of the tenant.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before --all.")] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            max=REDRIVE_BATCH_MAX,
            help=f"The most runs a batch sends back, oldest first (default and most "
            f"{REDRIVE_BATCH_MAX}).",
            show_default=False,
        ),
    ] = None,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send dead letters back for a new series of attempts: one run, several runs, a
    job's (--job) or all of them (--all). A batch lists what it sent back and what it
    skipped, and exits 1 when it skipped a run you named."""
    selectors = {"run ids": bool(run_ids), "--job": job_id is not None, "--all": every}
    given = [name for name, chosen in selectors.items() if chosen]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        fail(f"give run ids, --job ID or --all: exactly one of them{got}", code=2)
    if run_ids and len(run_ids) == 1:
        send_back(run_ids[0], "redrive", reason, url, api_key, tenant, as_json)
        return
    if every and not yes:
        _confirm_all(limit)
    with handle_errors(), client_for(url, api_key, tenant) as client:
        out = client.runs.redrive_many(
            run_ids, job_id=job_id, all=every, reason=reason, limit=limit
        )
    if as_json:
        print_json(out)
    else:
        _print_batch(out)
    if out["skipped"]:
        fail(f"{len(out['skipped'])} of the runs named were not sent back", code=1)


def _interactive() -> bool:
    return sys.stdin.isatty()


def _confirm_all(limit: int | None) -> None:
    if not _interactive():
        fail("--all sends back every dead letter of the tenant: add --yes to confirm", code=2)
    most = limit or REDRIVE_BATCH_MAX
    if not typer.confirm(f"Send back every dead letter of the tenant (at most {most})?"):
        fail("nothing sent back", code=1)


def _print_batch(out: dict[str, Any]) -> None:
    rows = [(run_id, "redriven", "") for run_id in out["run_ids"]]
    rows += [(s["run_id"], "skipped", s["reason"]) for s in out["skipped"]]
    if not rows:
        console.print("no dead letters matched: nothing sent back")
        return
    caption = "more dead letters match: run the command again" if out["more"] else None
    title = f"redriven {out['redriven']}, skipped {len(out['skipped'])}"
    console.print(table(title, ["run", "outcome", "reason"], rows, caption=caption))
