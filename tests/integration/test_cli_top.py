"""``cronwheel top`` against a real server (API + scheduler on a free port) with runs
that succeeded, failed and wait for a worker, on both backends: ``--once`` prints the
figures the overview holds; a failed read is a line in the frame, not a traceback;
Ctrl-C ends the live view; bad options are usage errors."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.cli import app
from cronwheel.client import Call
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.testing import wait_until

ADMIN = "top-admin-key"


@dataclass
class Scene:
    url: str
    operator_key: str
    tenant_id: str
    work_pool: str
    gpu_pool: str


def cli(url: str, key: str, *args: str) -> Result:
    env = {"CRONWHEEL_URL": url, "CRONWHEEL_API_KEY": key, "COLUMNS": "220"}
    return CliRunner().invoke(app, ["top", *args], env=env)


def row(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def _lease_two(worker: Client, worker_id: str) -> list[dict[str, Any]]:
    leased: list[dict[str, Any]] = []

    def take() -> bool:
        got = worker.send(
            Call("POST", f"/v1/workers/{worker_id}/lease", json={"max": 2, "wait": 1})
        )
        leased.extend(got["attempts"])
        return len(leased) == 2

    wait_until(take, timeout=30, what="two runs leased")
    return leased


@pytest.fixture
def scene(store_url: str, tmp_path: Path) -> Iterator[Scene]:
    """A server whose routing check runs often; a tenant with one run succeeded, one
    failed and two no live worker can take."""
    settings = Settings(
        database_url=store_url,
        data_dir=tmp_path,
        port=0,
        admin_key=ADMIN,
        route_check_interval=0.2,
        route_wait=0.0,
    )
    work, gpu = f"work-{uuid.uuid4().hex[:6]}", f"gpu-{uuid.uuid4().hex[:6]}"
    with BackgroundRuntime(Runtime(settings)) as server, Client(server.url, api_key=ADMIN) as admin:
        tenant = admin.tenants.create(f"top-{uuid.uuid4().hex[:6]}")
        worker_key = admin.tenants.create_key(tenant["id"], role="worker")["api_key"]
        with (
            Client(server.url, api_key=tenant["api_key"]) as operator,
            Client(server.url, api_key=worker_key) as worker,
        ):
            for name in ("ok", "bad"):
                operator.jobs.create(name=name, schedule={"asap": True}, task="t", pool=work)
            for _ in range(2):
                operator.jobs.create(
                    name="gpu", schedule={"asap": True}, task="t", pool=gpu, requires=["cuda"]
                )
            registered = worker.send(
                Call("POST", "/v1/workers", json={"pool": work, "capacity": 4})
            )
            done, failed = _lease_two(worker, registered["worker_id"])
            worker.send(
                Call(
                    "POST",
                    f"/v1/attempts/{done['attempt_id']}/complete",
                    json={"fencing_token": done["fencing_token"]},
                )
            )
            worker.send(
                Call(
                    "POST",
                    f"/v1/attempts/{failed['attempt_id']}/fail",
                    json={
                        "fencing_token": failed["fencing_token"],
                        "error": "boom",
                        "retryable": False,
                    },
                )
            )
            wait_until(
                lambda: [a["runs"] for a in operator.alerts.list()] == [2],
                timeout=30,
                what="the alert of the runs no worker can take",
            )
        yield Scene(server.url, tenant["api_key"], tenant["id"], work, gpu)


def test_once_prints_the_overviews_figures(scene: Scene) -> None:
    result = cli(scene.url, scene.operator_key, "--once", "--minutes", "10")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "runs due per minute, by state now (10 min)" in out
    assert row(out, "runs due")[1] == "4"
    assert row(out, "success rate")[1] == "50.0 %"
    # window total, this minute's (all four are due within a few seconds: in one minute
    # or, at a minute's turn, two).
    assert row(out, "SUCCESS")[1] == "1"
    assert row(out, "FAILED")[1] == "1"
    assert row(out, "DISPATCHED")[1] == "2"
    assert row(out, "DEAD_LETTER")[1] == "0"
    for label in ("dispatch lateness p50 / p99", "start lateness p50 / p99"):
        window, now = row(out, label)[1:3]
        assert now != "-" and window.endswith(("ms", "s"))
    [_kind, tenant, pool, runs] = row(out, "unroutable_runs")[:4]
    assert (tenant, pool, runs) == (scene.tenant_id, scene.gpu_pool, "2")
    # A tenant's key: its workers and waiting runs, no free slots (other tenants' work).
    assert row(out, scene.work_pool)[1:5] == ["1", "4", "0", "-"]
    assert row(out, scene.gpu_pool)[1:] == ["0", "0", "0", "-", "2", "0"]

    # The admin key sees the free slots, here of every tenant; the same runs.
    admin = cli(scene.url, ADMIN, "--once")
    assert admin.exit_code == 0, admin.output
    assert row(admin.stdout, scene.work_pool)[1:5] == ["1", "4", "0", "4"]
    assert row(admin.stdout, "runs due")[1] == "4"


def test_another_tenant_sees_none_of_it(scene: Scene) -> None:
    with Client(scene.url, api_key=ADMIN) as admin:
        other = admin.tenants.create(f"other-{uuid.uuid4().hex[:6]}")
    result = cli(scene.url, other["api_key"], "--once")
    assert result.exit_code == 0, result.output
    assert row(result.stdout, "runs due")[1] == "0"
    assert row(result.stdout, "success rate")[1] == "-"
    assert "no active alerts" in result.stdout
    assert scene.gpu_pool not in result.stdout


def test_a_failed_read_is_shown_in_the_frame(scene: Scene) -> None:
    result = cli(scene.url, "not-a-key", "--once")
    assert result.exit_code == 1
    assert "error:" in result.stdout and "[unauthorized]" in result.stdout
    assert "Traceback" not in result.output
    gone = cli("http://127.0.0.1:9", scene.operator_key, "--once")
    assert gone.exit_code == 1
    assert "is the server running?" in gone.stdout


def test_the_live_view_refreshes_until_ctrl_c(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise KeyboardInterrupt

    # (``cronwheel.cli.top`` the attribute is the command; the module is imported by name.)
    monkeypatch.setattr(importlib.import_module("cronwheel.cli.top"), "_sleep", sleep)
    result = cli(scene.url, scene.operator_key, "--interval", "0.5")
    assert result.exit_code == 0, result.output
    assert waits == [0.5, 0.5]
    assert "success rate" in result.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--minutes", "0"], "--minutes"),
        (["--minutes", "1441"], "--minutes"),
        (["--minutes", "ten"], "--minutes"),
        (["--interval", "0"], "--interval"),
        (["--interval", "-1"], "--interval"),
        (["--interval", "fast"], "--interval"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], named: str) -> None:
    result = cli("http://127.0.0.1:9", "some-key", *args)
    assert result.exit_code == 2
    assert named in result.output


def test_no_key_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["top", "--once"], env={"CRONWHEEL_API_KEY": ""})
    assert result.exit_code == 2
    assert "no API key" in result.output
