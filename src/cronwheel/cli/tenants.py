"""``cronwheel tenants …``: tenants and their keys (the admin key's commands)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any

import typer
from rich.table import Table

from cronwheel.cli.options import DEFAULT_URL, ApiKeyOpt, JsonOpt, ReasonOpt, UrlOpt, client_for
from cronwheel.cli.output import (
    command_group,
    console,
    count,
    fail,
    handle_errors,
    print_json,
    short_time,
    table,
)
from cronwheel.client import Client
from cronwheel.domain.spec import TenantLimits

__all__ = [
    "keys_app",
    "tenants_app",
    "tenants_create",
    "tenants_create_key",
    "tenants_delete",
    "tenants_keys_list",
    "tenants_keys_revoke",
    "tenants_limits",
    "tenants_list",
    "tenants_set_limits",
]

tenants_app = command_group(
    "Tenants, their limits and their keys (admin key): create, list, limits, set-limits, delete."
)
keys_app = command_group("A tenant's API keys: list, revoke (admin key).")
tenants_app.add_typer(keys_app, name="keys")


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant; prints its first operator key (shown once)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        tenant = client.tenants.create(name)
    if as_json:
        print_json(tenant)
        return
    console.print(
        f"[green]created[/] tenant [bold]{tenant['id']}[/] ({tenant['name']})", highlight=False
    )
    if tenant.get("api_key"):
        console.print(f"operator key (shown once): {tenant['api_key']}", highlight=False)


@tenants_app.command("list")
def tenants_list(
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 100,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Tenants."""
    with handle_errors(), client_for(url, api_key, None) as client:
        page = client.tenants.list(limit=limit)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (t["id"], t["name"], json.dumps(t.get("limits") or {}), short_time(t.get("created_at")))
        for t in page.items
    ]
    console.print(table(f"tenants ({len(rows)})", ["id", "name", "limits", "created"], rows))


@tenants_app.command("create-key")
def tenants_create_key(
    tenant_id: Annotated[str, typer.Argument(help="The tenant id.")],
    role: Annotated[str, typer.Option("--role", help="operator | viewer | worker")] = "operator",
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new key for a tenant (shown once)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        key = client.tenants.create_key(tenant_id, role=role)
    if as_json:
        print_json(key)
        return
    console.print(f"{key.get('role', role)} key (shown once): {key['api_key']}", highlight=False)


@keys_app.command("list")
def tenants_keys_list(
    tenant: Annotated[str, typer.Argument(help="The tenant's id or name.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 100,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A tenant's keys, revoked ones too (never the keys themselves)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        page = client.tenants.list_keys(_tenant_id(client, tenant), limit=limit)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            k["id"],
            k["role"],
            k["prefix"],
            short_time(k.get("created_at")),
            short_time(k.get("revoked_at")) if k.get("revoked_at") else "-",
        )
        for k in page.items
    ]
    console.print(
        table(f"keys ({len(rows)})", ["id", "role", "prefix", "created", "revoked"], rows)
    )


@keys_app.command("revoke")
def tenants_keys_revoke(
    tenant: Annotated[str, typer.Argument(help="The tenant's id or name.")],
    key_id: Annotated[str, typer.Argument(help="The key's id (see 'tenants keys list').")],
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key: it stops working at once, on every API node."""
    with handle_errors(), client_for(url, api_key, None) as client:
        key = client.tenants.revoke_key(_tenant_id(client, tenant), key_id, reason=reason)
    if as_json:
        print_json(key)
        return
    console.print(
        f"[green]revoked[/] {key['role']} key {key['id']} ({key['prefix']}…)", highlight=False
    )


def _value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _limits_table(tenant: dict[str, Any]) -> Table:
    limits = tenant.get("limits") or {}
    rows = [
        (name, _value(limits.get(name)), field.description or "")
        for name, field in TenantLimits.model_fields.items()
    ]
    return table(
        f"limits of {tenant['name']} ({tenant['id']})",
        ["limit", "value", "what it bounds"],
        rows,
        caption="- : no limit",
    )


@tenants_app.command("limits")
def tenants_limits(
    tenant: Annotated[str, typer.Argument(help="The tenant's id or name.")],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A tenant's limits (docs/limits.md)."""
    with handle_errors(), client_for(url, api_key, None) as client:
        out = client.tenants.get(_tenant_id(client, tenant))
    if as_json:
        print_json(out["limits"])
        return
    console.print(_limits_table(out))


_LIMIT_NAMES = ", ".join(TenantLimits.model_fields)


@tenants_app.command("set-limits")
def tenants_set_limits(
    tenant: Annotated[str, typer.Argument(help="The tenant's id or name.")],
    max_concurrent_runs: Annotated[
        int | None, typer.Option(help="Runs leased or running at once.")
    ] = None,
    max_dispatch_rate: Annotated[
        float | None, typer.Option(help="Runs handed to workers per second.")
    ] = None,
    dispatch_burst: Annotated[
        int | None, typer.Option(help="Runs handed out at once above the rate.")
    ] = None,
    max_pending_runs: Annotated[
        int | None,
        typer.Option(help="Runs scheduled or waiting for a worker; more are refused (429)."),
    ] = None,
    api_rate: Annotated[float | None, typer.Option(help="API requests per second per key.")] = None,
    api_burst: Annotated[
        int | None, typer.Option(help="API requests a key may make at once above the rate.")
    ] = None,
    weight: Annotated[
        float | None, typer.Option(help="Share of a contended pool, against other tenants.")
    ] = None,
    clear: Annotated[
        list[str] | None,
        typer.Option("--clear", help=f"Remove a limit (repeatable): {_LIMIT_NAMES}."),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a tenant's limits: only those given change. A bad value is refused and
    changes nothing. Applies on every API node within 5 seconds."""
    given: dict[str, Any] = {
        "max_concurrent_runs": max_concurrent_runs,
        "max_dispatch_rate": max_dispatch_rate,
        "dispatch_burst": dispatch_burst,
        "max_pending_runs": max_pending_runs,
        "api_rate": api_rate,
        "api_burst": api_burst,
        "weight": weight,
    }
    changes = {name: value for name, value in given.items() if value is not None}
    for name in clear or []:
        if name not in TenantLimits.model_fields:
            fail(f"--clear {name}: no such limit (one of {_LIMIT_NAMES})")
        if name in changes:
            fail(f"--clear {name} and --{name.replace('_', '-')} contradict each other")
        changes[name] = None
    if not changes:
        fail("nothing to change: give a limit (see --help) or --clear NAME")
    with handle_errors(), client_for(url, api_key, None) as client:
        out = client.tenants.update(_tenant_id(client, tenant), limits=changes)
    if as_json:
        print_json(out)
        return
    console.print(_limits_table(out))


def _tenant_id(client: Client, tenant: str) -> str:
    """The id of the tenant named ``tenant`` (an id, or a name)."""
    try:
        return str(uuid.UUID(tenant))
    except ValueError:
        pass
    cursor: str | None = None
    while True:
        page = client.tenants.list(cursor=cursor, limit=500)
        for item in page.items:
            if item["name"] == tenant:
                return str(item["id"])
        if not page.next_cursor:
            fail(f"no tenant named {tenant!r}")
        cursor = page.next_cursor


@tenants_app.command("delete")
def tenants_delete(
    tenant: Annotated[str, typer.Argument(help="The tenant's id or name.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Also end its jobs not over and runs in progress (otherwise the deletion "
            "is refused).",
        ),
    ] = False,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a tenant with its keys (refused from then on), workers, jobs and their
    history. Refused while it has jobs active or paused or runs in progress, unless
    --force. The deletion itself stays in the audit trail."""
    with handle_errors(), client_for(url, api_key, None) as client:
        out = client.tenants.delete(_tenant_id(client, tenant), force=force, reason=reason)
    if as_json:
        print_json(out)
        return
    ended = f" ({out['runs_stopped']} in progress)" if out["runs_stopped"] else ""
    console.print(
        f"[red]deleted[/] tenant [bold]{out['id']}[/] ({out['name']}) with "
        f"{count(out['jobs_deleted'], 'job')}, {count(out['runs_deleted'], 'run')}{ended}, "
        f"{count(out['api_keys_deleted'], 'API key')} and "
        f"{count(out['workers_deleted'], 'worker')}",
        highlight=False,
    )
