"""``cronwheel pools …``: each pool's live capacity and backlog, and the share of
worker slots kept for P0 runs (set by the admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cronwheel.cli.options import (
    DEFAULT_URL,
    ApiKeyOpt,
    JsonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
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

__all__ = ["pools_app", "pools_list", "pools_set", "pools_show"]

pools_app = command_group("Pools: live capacity, backlog, and the slots kept for P0 runs.")

_NameArg = Annotated[str, typer.Argument(help="The pool's name.", show_default=False)]


def _share(pool: dict[str, Any]) -> str:
    own = pool.get("p0_reserved_share")
    effective = pool.get("effective_share")
    return f"{effective:g}" if own is not None else f"{effective:g} (default)"


def _free(pool: dict[str, Any]) -> str:
    free = pool.get("free")
    return "-" if free is None else str(free)


def _backlog_table(title: str, pools: list[dict[str, Any]]) -> Any:
    rows = [
        (p["name"], b["priority_class"], b["tenant"], b["ready"], b["due"])
        for p in pools
        for b in p.get("backlog") or []
    ]
    return table(title, ["pool", "class", "tenant", "ready", "due"], rows)


@pools_app.command("list")
def pools_list(
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pools with a live worker or a backlog: slots and what waits for them.

    Slots: of the live workers, busy (running or reserved), free, kept for P0. Ready:
    runs in the ready queue; due: due and not dispatched yet. The admin key sees every
    tenant's backlog (one tenant's with --tenant); a tenant key the workers serving its
    tenant, its own runs only, and no free count (it depends on other tenants' work)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        pools = client.pools.list()
    if as_json:
        print_json({"items": pools})
        return
    rows = [
        (
            p["name"],
            p["workers"],
            p["capacity"],
            p["busy"],
            _free(p),
            _share(p),
            p["p0_reserved_slots"],
            p["ready"],
            p["due"],
        )
        for p in pools
    ]
    columns = ["pool", "workers", "slots", "busy", "free", "P0 share", "P0 slots", "ready", "due"]
    console.print(table(f"pools ({len(rows)})", columns, rows))
    if any(p.get("backlog") for p in pools):
        console.print(_backlog_table("backlog", pools))


@pools_app.command("show")
def pools_show(
    name: _NameArg,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One pool: its slots, its P0 share and its backlog by class and tenant."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        pool = client.pools.get(name)
    if as_json:
        print_json(pool)
        return
    _print_pool(pool)


def _print_pool(pool: dict[str, Any]) -> None:
    console.print(
        key_values(
            f"pool {pool['name']}",
            {
                "live workers": pool["workers"],
                "slots": pool["capacity"],
                "busy": pool["busy"],
                "free": _free(pool),
                "P0 share": _share(pool),
                "P0 slots": pool["p0_reserved_slots"],
                "ready": pool["ready"],
                "due": pool["due"],
                "share set": short_time(pool.get("updated_at")) or None,
            },
        )
    )
    if pool.get("backlog"):
        console.print(_backlog_table("backlog", [pool]))


@pools_app.command("set")
def pools_set(
    name: _NameArg,
    share: Annotated[
        float | None,
        typer.Option(
            "--p0-share",
            min=0.0,
            max=1.0,
            help="The share (0..1) of each live worker's slots that only P0 runs may take.",
            show_default=False,
        ),
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Back to the server's default share.")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set the pool's P0 share (admin key): --p0-share 0.2, or --default."""
    if (share is None) == (not default):
        fail("give exactly one of --p0-share or --default", code=2)
    with handle_errors(), client_for(url, api_key, None) as client:
        pool = client.pools.update(name, p0_reserved_share=None if default else share)
    if as_json:
        print_json(pool)
        return
    _print_pool(pool)
