"""``cronwheel audit``: who changed what, when and why."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cronwheel.cli.options import (
    DEFAULT_URL,
    ApiKeyOpt,
    CursorOpt,
    JsonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    parse_instant,
)
from cronwheel.cli.output import console, handle_errors, print_json, short_time, table

__all__ = ["audit"]


def audit(
    actor: Annotated[
        str | None,
        typer.Option("--actor", help="A key's id, or admin.", show_default=False),
    ] = None,
    action: Annotated[
        str | None,
        typer.Option("--action", help="e.g. job.pause, run.cancel.", show_default=False),
    ] = None,
    target_kind: Annotated[
        str | None,
        typer.Option("--target-kind", help="job, run, tenant, key, pool.", show_default=False),
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", help="The target's id.", show_default=False)
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Made at or after (ISO-8601 with offset).", show_default=False
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Made before (ISO-8601 with offset).", show_default=False),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit trail, newest first: every change made through the API, with who made
    it (key and role), the request, the target, the reason and what changed. A tenant
    key shows its tenant's records; the admin key every record (one tenant's with
    --tenant)."""
    start = None if since is None else parse_instant(since, "--since")
    end = None if until is None else parse_instant(until, "--until")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.audit.list(
            actor=actor,
            action=action,
            target_kind=target_kind,
            target=target,
            since=start,
            until=end,
            cursor=cursor,
            limit=limit,
        )
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            short_time(r.get("at")),
            r.get("actor"),
            r.get("role") or "-",
            r.get("action"),
            f"{r.get('target_kind')} {r.get('target_id') or ''}".strip(),
            r.get("reason") or "-",
            _changes(r.get("before"), r.get("after")),
        )
        for r in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"audit ({len(rows)})",
            ["at", "actor", "role", "action", "target", "reason", "changed"],
            rows,
            caption=caption,
        )
    )


def _changes(before: Any, after: Any) -> str:
    """``field: old → new`` for each field a record names, compactly."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    parts = []
    for key in {**old, **new}:
        if key in old and key in new:
            parts.append(f"{key}: {_short(old[key])} → {_short(new[key])}")
        elif key in new:
            parts.append(f"{key}: {_short(new[key])}")
        else:
            parts.append(f"{key}: {_short(old[key])} → -")
    return "; ".join(parts) or "-"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."
