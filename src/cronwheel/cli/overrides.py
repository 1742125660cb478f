"""``cronwheel overrides``: change what a job's next or future runs, or one run, are
made with — payload (a JSON merge-patch), timeout, priority, pool — without editing the
job; list them and take them back (docs/overrides.md)."""

from __future__ import annotations

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
    parse_json_object,
)
from cronwheel.cli.output import (
    command_group,
    console,
    count,
    fail,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)

__all__ = [
    "overrides_add",
    "overrides_app",
    "overrides_clear",
    "overrides_list",
    "overrides_remove",
]

overrides_app = command_group(
    "Runtime overrides of a job's next or future runs, or of one run: add, list, remove, "
    "clear. Merge order: job < future < next < run."
)

_Job = Annotated[str | None, typer.Option("--job", help="The job id.", show_default=False)]
_Run = Annotated[
    str | None,
    typer.Option("--run", help="The run id (one run not started yet).", show_default=False),
]


def _target(job: str | None, run: str | None) -> dict[str, str]:
    if (job is None) == (run is None):
        fail("name the job (--job) or the run (--run), one of them")
    return {"job_id": job} if job is not None else {"run_id": run or ""}


def _summary(o: dict[str, Any]) -> Any:
    values = {
        "id": o["id"],
        "scope": o["scope"],
        "status": o["status"],
        "job": o["job_id"],
        "run": o.get("run_id"),
        "payload patch": o.get("payload"),
        "timeout": o.get("timeout"),
        "priority": o.get("priority"),
        "pool": o.get("pool"),
        "reason": o.get("reason"),
        "by": o.get("created_by"),
        "created": short_time(o.get("created_at")),
        "removed": short_time(o.get("removed_at")) if o.get("removed_at") else None,
    }
    if o.get("runs") is not None:
        values["runs changed now"] = count(len(o["runs"]), "run")
    return key_values("override", values)


@overrides_app.command("add")
def overrides_add(
    job: _Job = None,
    run: _Run = None,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            help="With --job: next (the next occurrence only) or future (every run not "
            "started yet, and every one made until removed).",
            show_default=False,
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            help='A JSON merge-patch over the payload, e.g. \'{"region": "us", "old": null}\' '
            "(null removes a key).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds.", show_default=False)
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", min=0, max=3, show_default=False)
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", show_default=False)] = None,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Override a job's next or future runs (--job, --scope), or one run (--run)."""
    target = _target(job, run)
    if run is not None and scope not in (None, "run"):
        fail("--scope is for a job's overrides; one run's (--run) is its own scope")
    if job is not None and scope not in ("next", "future"):
        fail("--scope must be next or future with --job")
    patch = parse_json_object(payload, "--payload") if payload is not None else None
    with handle_errors(), client_for(url, api_key, tenant) as client:
        made = client.overrides.create(
            **target,
            scope=scope if job is not None else None,
            payload=patch,
            timeout=timeout,
            priority=priority,
            pool=pool,
            reason=reason,
        )
    if as_json:
        print_json(made)
        return
    console.print(_summary(made))


@overrides_app.command("list")
def overrides_list(
    job: _Job = None,
    run: _Run = None,
    ended: Annotated[
        bool, typer.Option("--ended", help="Also those consumed by their run or removed.")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A job's overrides, or those that made a run, in the merge order."""
    target = _target(job, run)
    with handle_errors(), client_for(url, api_key, tenant) as client:
        items = client.overrides.list(**target, ended=ended)
    if as_json:
        print_json({"items": items})
        return
    rows = [
        (
            o["id"],
            o["scope"],
            o["status"],
            o.get("run_id") or "-",
            ", ".join(
                f"{name}={o[name]}" for name in ("timeout", "priority", "pool") if o.get(name)
            )
            + (f" payload {sorted(o['payload'])}" if o.get("payload") else ""),
            short_time(o.get("created_at")),
            o.get("reason") or "-",
        )
        for o in items
    ]
    console.print(
        table(
            f"overrides ({len(rows)})",
            ["id", "scope", "status", "run", "sets", "created", "reason"],
            rows,
        )
    )


@overrides_app.command("remove")
def overrides_remove(
    override_id: Annotated[str, typer.Argument(help="The override id.")],
    job: _Job = None,
    run: _Run = None,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Take an override back: the runs not started yet that it changed are made again
    without it (--job: the job's override; --run: one bound to that run)."""
    target = _target(job, run)
    with handle_errors(), client_for(url, api_key, tenant) as client:
        removed = client.overrides.remove(override_id, **target, reason=reason)
    if as_json:
        print_json(removed)
        return
    console.print(_summary(removed))


@overrides_app.command("clear")
def overrides_clear(
    job: Annotated[str, typer.Option("--job", help="The job id.")],
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Take back every active override of the job."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        removed = client.overrides.remove_all(job, reason=reason)
    if as_json:
        print_json({"items": removed})
        return
    console.print(f"removed {count(len(removed), 'override')}", highlight=False)
