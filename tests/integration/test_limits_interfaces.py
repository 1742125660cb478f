"""Every tenant limit through the blocking client and the CLI, against a real server
on both backends: set, shown (a table), cleared; a bad value fails with a non-zero exit
and changes nothing."""

from __future__ import annotations

import pytest
from cli_server import CLI_ADMIN_KEY, Server

from cronwheel import ApiError, Client
from cronwheel.domain.spec import TenantLimits

EVERY = {
    "max_concurrent_runs": 5,
    "max_dispatch_rate": 2.5,
    "dispatch_burst": 10,
    "max_pending_runs": 1000,
    "api_rate": 20.0,
    "api_burst": 40,
    "weight": 3.0,
}


def test_the_blocking_client_reads_and_sets_every_limit(cli_server: Server) -> None:
    with Client(cli_server.url, api_key=CLI_ADMIN_KEY) as admin:
        tid = cli_server.tenant_id
        assert admin.tenants.update(tid, limits=EVERY)["limits"] == EVERY
        out = admin.tenants.update(tid, limits=TenantLimits(max_pending_runs=None))
        assert out["limits"] == {**EVERY, "max_pending_runs": None}
        with pytest.raises(ApiError) as info:
            admin.tenants.update(tid, limits={"api_burst": -1})
        assert (info.value.status, info.value.field) == (422, "limits.api_burst")
        assert admin.tenants.get(tid)["limits"] == out["limits"]


def test_the_cli_sets_shows_and_clears_limits(cli_server: Server) -> None:
    server, tid = cli_server, cli_server.tenant_id
    args = [f"--{name.replace('_', '-')}={value}" for name, value in EVERY.items()]
    out = server.json("tenants", "set-limits", tid, *args, key=CLI_ADMIN_KEY)
    assert out["limits"] == EVERY
    assert server.json("tenants", "limits", tid, key=CLI_ADMIN_KEY) == EVERY

    shown = server.cli("tenants", "limits", tid, key=CLI_ADMIN_KEY, COLUMNS="200")
    assert shown.exit_code == 0, shown.output
    for name, value in EVERY.items():
        line = next(row for row in shown.stdout.splitlines() if f" {name} " in row)
        assert f" {value:g} " in line, line
    assert "runs scheduled or waiting for a worker" in shown.stdout

    cleared = server.json("tenants", "set-limits", tid, "--clear", "api_rate", key=CLI_ADMIN_KEY)
    assert cleared["limits"] == {**EVERY, "api_rate": None}


@pytest.mark.parametrize(
    "args",
    [
        ("--max-pending-runs", "0"),
        ("--api-rate", "-1"),
        ("--weight", "0"),
        ("--clear", "weight"),
        ("--clear", "bogus"),
        ("--api-rate", "2", "--clear", "api_rate"),
        (),
    ],
)
def test_bad_cli_values_fail_and_change_nothing(cli_server: Server, args: tuple[str, ...]) -> None:
    server, tid = cli_server, cli_server.tenant_id
    before = server.json("tenants", "limits", tid, key=CLI_ADMIN_KEY)
    result = server.cli("tenants", "set-limits", tid, *args, key=CLI_ADMIN_KEY)
    assert result.exit_code != 0
    assert "error" in result.stderr
    assert server.json("tenants", "limits", tid, key=CLI_ADMIN_KEY) == before
