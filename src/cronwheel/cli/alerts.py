"""``cronwheel alerts``: what needs attention now, as the dashboard shows it."""

from __future__ import annotations

from cronwheel.cli.options import DEFAULT_URL, ApiKeyOpt, JsonOpt, TenantOpt, UrlOpt, client_for
from cronwheel.cli.output import console, handle_errors, print_json, short_time, table

__all__ = ["alerts"]


def alerts(
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Active alerts, longest-standing first: runs no live worker can take (their pool,
    tenant and required capabilities), runs a scheduler step failed on (quarantined
    dead letters, their job named), runs not dispatched within their job's lateness
    budget (missed), and recurring jobs whose schedule stalled. A tenant key shows its
    tenant's; the admin key every tenant's (one tenant's with --tenant)."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        items = client.alerts.list()
    if as_json:
        print_json({"items": items})
        return
    if not items:
        console.print("no active alerts", highlight=False)
        return
    rows = [
        (
            a.get("kind"),
            a.get("tenant_id"),
            a.get("pool"),
            ", ".join(a.get("requires") or []) or "-",
            a.get("runs"),
            short_time(a.get("since")),
            a.get("message"),
        )
        for a in items
    ]
    console.print(
        table(
            f"alerts ({len(rows)})",
            ["kind", "tenant", "pool", "requires", "runs", "since", "message"],
            rows,
        )
    )
