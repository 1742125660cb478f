"""Recurring jobs from the command line: ``jobs create --cron/--every``, ``jobs pause |
resume | trigger | backfill | preview`` against a real server (both backends), and the
offline ``schedule preview``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.cli import app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.timing import local_form, occurrences
from cronwheel.timing.spread import spread_instant

ADMIN_KEY = "cli-recurring-admin-key"
runner = CliRunner()


def offline(*args: str) -> Result:
    """``cronwheel <args>`` with no server anywhere."""
    env = {"CRONWHEEL_URL": "http://127.0.0.1:9", "CRONWHEEL_API_KEY": "", "COLUMNS": "250"}
    return runner.invoke(app, list(args), env=env)


@dataclass
class Server:
    url: str
    operator_key: str

    def cli(self, *args: str) -> Result:
        env = {"CRONWHEEL_URL": self.url, "CRONWHEEL_API_KEY": self.operator_key, "COLUMNS": "250"}
        return runner.invoke(app, list(args), env=env)

    def json(self, *args: str) -> Any:
        result = self.cli(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[Server]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    # No scheduler: what the commands do is seen in the store as they left it.
    with (
        BackgroundRuntime(Runtime(settings, scheduler=False)) as running,
        Client(running.url, api_key=ADMIN_KEY) as admin,
    ):
        tenant = admin.tenants.create(f"cli-rec-{uuid.uuid4().hex[:6]}")
        yield Server(running.url, tenant["api_key"])


CREATE = ("jobs", "create", "--name", "nightly", "--task", "report")


def test_create_recurring_jobs(server: Server) -> None:
    job = server.json(
        *CREATE,
        "--cron",
        "30 1 * * *",
        "--tz",
        "Europe/Paris",
        "--on-ambiguous",
        "all",
        "--on-nonexistent",
        "skip",
        "--catch-up",
        "replay",
        "--overlap",
        "queue_one",
    )
    assert job["schedule"] == {
        "cron": "30 1 * * *",
        "timezone": "Europe/Paris",
        "on_ambiguous": "all",
        "on_nonexistent": "skip",
        "catch_up": "replay",
        "catch_up_window": 3600.0,
        "overlap": "queue_one",
    }
    due = datetime.fromisoformat(job["next_due_at"])
    assert local_form(due, "Europe/Paris")[11:19] == "01:30:00"

    start = "2020-01-01T00:00:05Z"
    every = server.json(*CREATE, "--every", "90", "--start", start, "--overlap", "skip")
    assert every["schedule"]["interval"] == 90 and every["schedule"]["overlap"] == "skip"
    assert datetime.fromisoformat(every["schedule"]["start"]) == datetime(
        2020, 1, 1, 0, 0, 5, tzinfo=UTC
    )
    hourly = server.json(*CREATE, "--cron", "@hourly")
    assert hourly["schedule"]["timezone"] == "UTC"

    result = server.cli("jobs", "list")
    assert result.exit_code == 0, result.output
    assert "cron 30 1 * * * Europe/Paris" in result.stdout and "interval 90 s" in result.stdout


@pytest.mark.parametrize(
    ("args", "exit_code", "words"),
    [
        (("--delay", "5", "--tz", "UTC"), 2, ("--tz", "does not apply to --delay")),
        (("--every", "5", "--tz", "UTC"), 2, ("--tz", "does not apply to --every")),
        (("--cron", "* * * * *", "--start", "2030-01-01T00:00:00Z"), 2, ("--start",)),
        (("--asap", "--overlap", "skip"), 2, ("--overlap", "does not apply to --asap")),
        (("--cron", "* * * * *", "--every", "5"), 2, ("exactly one of", "--cron, --every")),
        (("--cron", "* * * * *", "--on-ambiguous", "both"), 2, ("--on-ambiguous",)),
        (("--every", "0"), 2, ("--every",)),
        (("--cron", "0 25 * * *"), 1, ("schedule.cron", "hour", "25")),
        (("--cron", "0 * * * *", "--tz", "Mars/Base"), 1, ("schedule.timezone", "Mars/Base")),
        (("--every", "60", "--spread", "60"), 1, ("spread", "shortest interval")),
        (("--asap", "--spread", "-1"), 2, ("--spread",)),
    ],
)
def test_create_refuses_what_does_not_fit(
    server: Server, args: tuple[str, ...], exit_code: int, words: tuple[str, ...]
) -> None:
    result = server.cli(*CREATE, *args)
    assert result.exit_code == exit_code, result.output
    assert all(w in result.stderr for w in words), result.stderr
    assert server.json("jobs", "list")["items"] == []


def test_control_commands(server: Server) -> None:
    job = server.json(*CREATE, "--cron", "0 * * * *", "--tz", "America/New_York")
    job_id = job["id"]

    result = server.cli("jobs", "pause", job_id, "--reason", "maintenance")
    assert result.exit_code == 0 and f"paused job {job_id}" in result.stdout
    result = server.cli("jobs", "pause", job_id)
    assert result.exit_code == 1 and "illegal_transition" in result.stderr
    assert server.json("jobs", "resume", job_id)["state"] == "active"

    run = server.json("jobs", "trigger", job_id, "--payload", '{"dry": true}')
    assert run["origin"] == "trigger" and run["payload"] == {"dry": True}
    result = server.cli("jobs", "trigger", job_id)
    assert result.exit_code == 0 and "triggered run" in result.stdout
    result = server.cli("jobs", "trigger", job_id, "--payload", "[1]")
    assert result.exit_code == 2 and "JSON object" in result.stderr

    now = datetime.now(UTC).replace(microsecond=0)
    start, end = now - timedelta(hours=4), now - timedelta(minutes=1)
    span = ("--from", start.isoformat(), "--to", end.isoformat().replace("+00:00", "Z"))
    made = server.json("jobs", "backfill", job_id, *span, "--rate", "100")
    assert made["created"] == len(occurrences("0 * * * *", "UTC", start, end)) >= 3
    result = server.cli("jobs", "backfill", job_id, *span)
    assert result.exit_code == 0 and "0 runs created" in result.stdout
    result = server.cli("jobs", "backfill", job_id, "--from", span[3], "--to", span[1])
    assert result.exit_code == 1 and "(field to)" in result.stderr
    result = server.cli("jobs", "backfill", job_id, "--from", "yesterday", "--to", span[3])
    assert result.exit_code == 2 and "--from" in result.stderr

    preview = server.json("jobs", "preview", job_id, "--count", "3")
    assert len(preview["items"]) == 3
    result = server.cli("jobs", "preview", job_id, "-n", "2")
    assert result.exit_code == 0, result.output
    for item in preview["items"][:2]:
        assert item["due_at"] in result.stdout and item["due_local"] in result.stdout
    assert server.cli("jobs", "preview", job_id, "--count", "0").exit_code == 2

    server.cli("jobs", "cancel", job_id)
    result = server.cli("jobs", "preview", job_id)
    assert result.exit_code == 0 and "nothing due" in result.stdout
    result = server.cli("jobs", "pause", str(uuid.uuid4()))
    assert result.exit_code == 1 and "not_found" in result.stderr


def test_create_with_spread_and_preview_its_fire_times(server: Server) -> None:
    job = server.json(*CREATE, "--cron", "0 * * * *", "--spread", "900")
    assert job["spread"] == 900
    preview = server.json("jobs", "preview", job["id"], "--count", "3")
    for item in preview["items"]:
        due = datetime.fromisoformat(item["due_at"])
        fire = datetime.fromisoformat(item["fire_at"])
        assert fire == spread_instant(uuid.UUID(job["id"]), due, 900)
    result = server.cli("jobs", "preview", job["id"], "--count", "3")
    assert result.exit_code == 0, result.output
    assert "fires (UTC)" in result.stdout
    for item in preview["items"]:
        line = next(x for x in result.stdout.splitlines() if item["due_at"] in x)
        assert item["fire_at"] in line  # side by side


# -- offline ---------------------------------------------------------------------------


def test_schedule_preview_prints_utc_and_local_with_offsets() -> None:
    result = offline(
        "schedule",
        "preview",
        "30 1 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2030-11-02T00:00:00Z",
        "--count",
        "3",
        "--on-ambiguous",
        "all",
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "2030-11" in line]
    assert len(lines) == 3
    assert "2030-11-02T05:30:00Z" in lines[0] and "2030-11-02T01:30:00-04:00" in lines[0]
    assert "2030-11-03T05:30:00Z" in lines[1] and "-04:00" in lines[1]
    assert "ambiguous-first" in lines[1]
    assert "2030-11-03T06:30:00Z" in lines[2] and "2030-11-03T01:30:00-05:00" in lines[2]
    assert "ambiguous-second" in lines[2]


def test_schedule_preview_json_matches_the_time_engine() -> None:
    start = datetime(2031, 3, 8, tzinfo=UTC)
    result = offline(
        "schedule",
        "preview",
        "15 */5 * * * *",  # six fields: every 5 minutes at second 15
        "--tz",
        "Asia/Kolkata",
        "--from",
        start.isoformat(),
        "-n",
        "4",
        "--json",
    )
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    expected = occurrences("15 */5 * * * *", "Asia/Kolkata", start, start + timedelta(hours=1))
    assert [datetime.fromisoformat(i["due_at"]) for i in items] == expected[:4]
    assert all(i["due_local"].endswith("+05:30") for i in items)

    skipped = offline(
        "schedule",
        "preview",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2031-03-09T00:00:00Z",
        "-n",
        "1",
        "--on-nonexistent",
        "skip",
        "--json",
    )
    [item] = json.loads(skipped.stdout)
    assert item["kind"] == "skipped" and "does not exist" in item["reason"]


@pytest.mark.parametrize(
    ("args", "exit_code", "words"),
    [
        (("61 * * * *",), 1, ("EXPR", "minute", "61")),
        (("* * *",), 1, ("EXPR", "5 fields")),
        (("@sometimes",), 1, ("EXPR", "@sometimes")),
        (("0 22-2 * * *",), 1, ("EXPR", "hour", "22-23,0-2")),
        (("*/61 * * * *",), 1, ("EXPR", "minute", "from 1 to 60")),
        (("0 " * 200,), 1, ("EXPR", "at most 256")),
        (("0 * * * *", "--tz", "Mars/Base"), 1, ("--tz", "Mars/Base")),
        (("0 * * * *", "--from", "noon"), 2, ("--from",)),
        (("0 * * * *", "--from", "2030-01-01T00:00:00"), 2, ("no UTC offset",)),
        (("0 * * * *", "--count", "0"), 2, ("--count",)),
        (("0 * * * *", "--on-nonexistent", "later"), 2, ("--on-nonexistent",)),
    ],
)
def test_schedule_preview_errors_name_the_problem(
    args: tuple[str, ...], exit_code: int, words: tuple[str, ...]
) -> None:
    result = offline("schedule", "preview", *args)
    assert result.exit_code == exit_code, result.output
    assert all(w in result.stderr for w in words), result.stderr
    assert result.stdout == ""
