"""``cronwheel workers …``: the workers serving the tenant (every worker for the admin
key)."""

from __future__ import annotations

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
)
from cronwheel.cli.output import (
    command_group,
    console,
    handle_errors,
    print_json,
    short_time,
    table,
)

__all__ = ["workers_app", "workers_list"]

workers_app = command_group("Workers: what they run and whether they are live.")


def _labels(values: list[str] | None) -> str:
    return ", ".join(values or []) or "-"


def _state(worker: dict[str, Any]) -> str:
    if worker.get("deregistered"):
        return "deregistered"
    return "live" if worker.get("live") else "silent"


@workers_app.command("list")
def workers_list(
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool's workers.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 100,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Workers, oldest first: what each runs, its slots in use, whether it is live.

    Tasks "any": the worker declared none. Slots: in use of its capacity. State: live
    (counts for routing), silent (not seen within the server's worker TTL, holding no
    lease) or deregistered. A tenant key lists its tenant's workers and the shared ones;
    the admin key every worker (one tenant's with --tenant)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.workers.list(pool=pool, limit=limit, cursor=cursor)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            w["id"],
            w.get("name") or "",
            w.get("tenant_id") or "shared",
            w.get("pool"),
            "any" if w.get("tasks") is None else _labels(w.get("tasks")),
            _labels(w.get("capabilities")),
            _labels(w.get("tags")),
            f"{w.get('slots_in_use', 0)}/{w.get('capacity')}",
            short_time(w.get("last_seen_at")),
            _state(w),
        )
        for w in page.items
    ]
    console.print(
        table(
            f"workers ({len(rows)})",
            [
                "id",
                "name",
                "tenant",
                "pool",
                "tasks",
                "capabilities",
                "tags",
                "slots",
                "last seen",
                "state",
            ],
            rows,
            caption=f"more: --cursor {page.next_cursor}" if page.next_cursor else None,
        )
    )
