"""``cronwheel bulk``: one action on every job or run a selector matches, followed to the
end with a progress bar; ``cronwheel operations``: the operations, and one of them."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
    fail,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)

__all__ = ["bulk_app", "operations_app", "operations_list", "operations_show"]

bulk_app = command_group(
    "Act on every job or run a selector matches: cancel, pause, resume, redrive, trigger. "
    "The command waits for the end (--no-wait: it prints the operation at once)."
)
operations_app = command_group("Bulk operations: list, show.")

_Ids = Annotated[
    list[str] | None,
    typer.Option("--id", help="A job id (pause, resume, trigger) or run id; repeat it."),
]
_JobIds = Annotated[
    list[str] | None,
    typer.Option("--job", help="A job id (for run actions: its runs); repeat it."),
]
_Tags = Annotated[
    list[str] | None, typer.Option("--tag", help="A tag every one selected has; repeat it.")
]
_AnyTags = Annotated[
    list[str] | None, typer.Option("--any-tag", help="A tag, one of which each has.")
]
_Pool = Annotated[str | None, typer.Option("--pool", show_default=False)]
_Prefix = Annotated[str | None, typer.Option("--name-prefix", help="Jobs whose name starts so.")]
_States = Annotated[
    list[str] | None, typer.Option("--state", help="A run state (cancel, redrive); repeat it.")
]
_After = Annotated[str | None, typer.Option("--due-after", help="Due at or after (ISO-8601).")]
_Before = Annotated[str | None, typer.Option("--due-before", help="Due before (ISO-8601).")]
_All = Annotated[
    bool, typer.Option("--all", help="Everything of the tenant (needed for no selector).")
]
_NoWait = Annotated[bool, typer.Option("--no-wait", help="Print the operation and return.")]


def _uuids(values: list[str] | None, option: str) -> list[str] | None:
    if values is None:
        return None
    for value in values:
        try:
            uuid.UUID(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not an id", param_hint=f"'{option}'") from None
    return values


def _command(action: str, *, runs: bool) -> Any:
    def command(
        ids: _Ids = None,
        job_ids: _JobIds = None,
        tags: _Tags = None,
        any_tags: _AnyTags = None,
        pool: _Pool = None,
        name_prefix: _Prefix = None,
        states: _States = None,
        due_after: _After = None,
        due_before: _Before = None,
        everything: _All = False,
        reason: ReasonOpt = None,
        no_wait: _NoWait = False,
        url: UrlOpt = DEFAULT_URL,
        api_key: ApiKeyOpt = None,
        tenant: TenantOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        selector: dict[str, Any] = {
            "tags_all": tags or [],
            "tags_any": any_tags or [],
            "pool": pool,
            "name_prefix": name_prefix,
            "states": states or [],
            "due_after": due_after and parse_instant(due_after, "--due-after"),
            "due_before": due_before and parse_instant(due_before, "--due-before"),
        }
        named = _uuids(ids, "--id")
        if runs:
            selector["run_ids"] = named
            selector["job_ids"] = _uuids(job_ids, "--job")
        else:
            if job_ids:
                fail("--job: pass the jobs with --id", code=2)
            selector["job_ids"] = named
        selector = {k: v for k, v in selector.items() if v not in (None, [])}
        with handle_errors(), client_for(url, api_key, tenant) as client:
            op = client.bulk(action, everything=everything, reason=reason, **selector)
            if not no_wait:
                op = _follow(client, op)
        if as_json:
            print_json(op)
        else:
            console.print(_summary(op))
        if op.get("state") == "failed":
            raise typer.Exit(1)

    command.__doc__ = (
        f"{action.capitalize()} every {'run' if runs else 'job'} the options select "
        "(all of them must hold), and show how it went."
    )
    return command


for _action, _on_runs in (
    ("cancel", True),
    ("redrive", True),
    ("pause", False),
    ("resume", False),
    ("trigger", False),
):
    bulk_app.command(_action)(_command(_action, runs=_on_runs))


def _follow(client: Any, op: dict[str, Any]) -> dict[str, Any]:
    """Wait for the operation's end, with a progress bar of what it changed."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{op['action']} {op['id']}", total=None, counts="")

        def show(now: dict[str, Any]) -> None:
            progress.update(
                task,
                completed=now.get("changed", 0),
                counts=f"matched {now.get('matched', 0)} · changed {now.get('changed', 0)}",
            )

        done: dict[str, Any] = client.operations.wait(op["id"], progress=show)
        progress.update(task, total=max(1, done.get("matched", 0)))
    return done


def _summary(op: dict[str, Any]) -> Any:
    skipped = op.get("skipped") or {}
    values = {
        "operation": op.get("id"),
        "action": op.get("action"),
        "state": op.get("state"),
        "matched": op.get("matched"),
        "changed": op.get("changed"),
        "skipped": ", ".join(f"{why}: {n}" for why, n in skipped.items()) or "-",
        **{k.replace("_", " "): v for k, v in (op.get("details") or {}).items()},
        "accepted": short_time(op.get("accepted_at")),
        "finished": short_time(op.get("finished_at")),
    }
    if op.get("error"):
        values["error"] = op["error"]
    return key_values("operation", values)


@operations_app.command("list")
def operations_list(
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Bulk operations, newest first."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.operations.list(limit=limit, cursor=cursor)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            o["id"],
            o["action"],
            o["state"],
            o["matched"],
            o["changed"],
            sum((o.get("skipped") or {}).values()),
            short_time(o.get("accepted_at")),
            o.get("reason") or "-",
        )
        for o in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"operations ({len(rows)})",
            ["id", "action", "state", "matched", "changed", "skipped", "accepted", "reason"],
            rows,
            caption=caption,
        )
    )


@operations_app.command("show")
def operations_show(
    operation_id: Annotated[str, typer.Argument(help="The operation id.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One operation: its selector, counts and state."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        op = client.operations.get(operation_id)
    if as_json:
        print_json(op)
        return
    console.print(_summary(op))
