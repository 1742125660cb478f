"""``cronwheel jobs edit`` against a real server, on both backends: flags laid over the
job, the version read sent back, and bad input as a message and a non-zero exit."""

from __future__ import annotations

import json
import uuid

from cli_server import Server


def _cron_job(cli_server: Server) -> dict[str, object]:
    made = cli_server.json(
        "jobs", "create", "--name", "nightly", "--task", "t", "--cron", "0 2 * * *",
        "--tz", "Europe/Paris", "--catch-up", "skip", "--payload", '{"a": 1}',
    )  # fmt: skip
    return dict(made)


def test_flags_are_laid_over_the_job(cli_server: Server) -> None:
    job = _cron_job(cli_server)
    result = cli_server.cli(
        "jobs", "edit", str(job["id"]), "--cron", "30 3 * * *", "--pool", "night",
        "--max-attempts", "9", "--reason", "later",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"edited job {job['id']} (nightly): version 2" in result.stdout
    assert "30 3 * * *" in result.stdout and "night" in result.stdout  # as jobs show prints it
    shown = cli_server.json("jobs", "show", str(job["id"]))
    # The expression changed; its zone and policies stayed; the retry policy kept the rest.
    assert shown["schedule"]["timezone"] == "Europe/Paris"
    assert shown["schedule"]["catch_up"] == "skip"
    assert shown["retry"]["max_attempts"] == 9 and shown["retry"]["multiplier"] == 2.0

    edited = cli_server.json("jobs", "edit", str(job["id"]), "--tz", "Asia/Tokyo")
    assert edited["schedule"]["cron"] == "30 3 * * *" and edited["version"] == 3
    edited = cli_server.json(
        "jobs", "edit", str(job["id"]), "--every", "3600", "--payload", '{"b": 2}',
        "--reset", "pool",
    )  # fmt: skip
    assert edited["schedule"]["interval"] == 3600 and edited["schedule"]["catch_up"] == "skip"
    assert (edited["payload"], edited["pool"]) == ({"b": 2}, "default")
    whole = '{"cron": "0 6 * * 1", "timezone": "UTC"}'
    edited = cli_server.json("jobs", "edit", str(job["id"]), "--schedule-json", whole)
    assert edited["schedule"]["catch_up"] == "coalesce"  # the whole schedule, as given
    hook = cli_server.json(
        "jobs", "edit", str(job["id"]), "--webhook", "https://example.com/h",
        "--header", "Authorization=Bearer x",
    )  # fmt: skip
    assert hook["task"] is None and hook["webhook"]["headers"] == {"Authorization": "[redacted]"}
    back = cli_server.json("jobs", "edit", str(job["id"]), "--task", "t2")
    assert (back["task"], back["webhook"], back["requires"]) == ("t2", None, [])


def test_a_stale_version_and_bad_input_fail_clearly(cli_server: Server) -> None:
    job = _cron_job(cli_server)
    job_id = str(job["id"])
    cli_server.json("jobs", "edit", job_id, "--priority", "0")
    result = cli_server.cli("jobs", "edit", job_id, "--priority", "1", "--if-version", "1")
    assert result.exit_code == 1 and result.stdout == ""
    assert "[precondition_failed]" in result.stderr and "version 2" in result.stderr
    assert "run the command again" in result.stderr

    for args, words in (
        ((), "nothing to change"),
        (("--header", "A=b"), "--webhook"),
        (("--task", "a", "--webhook", "https://example.com"), "one of --task or --webhook"),
        (("--cron", "* * * * *", "--every", "60"), "exactly one of"),
        (("--start", "2030-01-01T00:00:00Z"), "does not apply"),
        (("--schedule-json", '{"cron": "* * * * *"}', "--tz", "UTC"), "whole schedule"),
        (("--payload", "[1]"), "JSON object"),
        (("--reset", "colour"), "no field of a job"),
        (("--reset", "pool", "--pool", "p"), "also given"),
    ):
        result = cli_server.cli("jobs", "edit", job_id, *args)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output, (args, result.output)

    for args, words in (
        (("--cron", "0 25 * * *"), "schedule.cron"),
        (("--at", "2030-01-01T00:00:00Z"), "schedule"),  # a recurring job stays recurring
        (("--tz", "Europe/Atlantis"), "Europe/Atlantis"),
    ):
        result = cli_server.cli("jobs", "edit", job_id, *args)
        assert result.exit_code == 1, (args, result.output)
        assert words in result.stderr, (args, result.stderr)
    assert cli_server.json("jobs", "show", job_id)["version"] == 2

    result = cli_server.cli("jobs", "edit", str(uuid.uuid4()), "--priority", "1")
    assert result.exit_code == 1 and "not_found" in result.stderr
    cli_server.cli("jobs", "cancel", job_id)
    result = cli_server.cli("jobs", "edit", job_id, "--priority", "1", "--json")
    assert result.exit_code == 1 and "illegal_transition" in result.stderr
    assert json.loads(cli_server.cli("jobs", "show", job_id, "--json").stdout)["priority"] == 0


def test_the_lateness_budget_is_set_and_edited(cli_server: Server) -> None:
    made = cli_server.json(
        "jobs", "create", "--name", "tight", "--task", "t", "--cron", "0 2 * * *",
        "--lateness-budget", "12",
    )  # fmt: skip
    assert made["lateness_budget"] == 12.0
    edited = cli_server.json("jobs", "edit", str(made["id"]), "--lateness-budget", "45")
    assert edited["lateness_budget"] == 45.0
    result = cli_server.cli("jobs", "edit", str(made["id"]), "--lateness-budget", "0")
    assert result.exit_code != 0
    assert cli_server.json("jobs", "show", str(made["id"]))["lateness_budget"] == 45.0
