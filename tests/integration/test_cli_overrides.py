"""``cronwheel overrides`` against a real server, on both backends — and the Python
client under it: add, list, remove, clear, and bad input as a message and a non-zero
exit."""

from __future__ import annotations

from cli_server import Server


def _yearly(cli_server: Server) -> dict[str, object]:
    made = cli_server.json(
        "jobs", "create", "--name", "report", "--task", "t", "--cron", "0 0 1 1 *",
        "--payload", '{"region": "eu", "old": 1}',
    )  # fmt: skip
    return dict(made)


def test_add_list_remove_and_clear(cli_server: Server) -> None:
    job = _yearly(cli_server)
    job_id, run_id = str(job["id"]), str(job["first_run_id"])
    made = cli_server.json(
        "overrides", "add", "--job", job_id, "--scope", "future",
        "--payload", '{"region": "us", "old": null}', "--timeout", "90", "--reason", "outage",
    )  # fmt: skip
    # The job's unstarted runs: its first (and, were the server's scheduler to fire it
    # meanwhile, the next one too).
    assert (made["scope"], made["status"]) == ("future", "active")
    assert run_id in made["runs"]
    run = cli_server.json("runs", "show", run_id)
    assert (run["payload"], run["timeout"], run["override_ids"]) == (
        {"region": "us"},
        90.0,
        [made["id"]],
    )
    own = cli_server.json("overrides", "add", "--run", run_id, "--priority", "0")
    assert (own["scope"], own["run_id"]) == ("run", run_id)

    shown = cli_server.cli("overrides", "list", "--job", job_id)
    assert shown.exit_code == 0, shown.output
    assert "overrides (2)" in shown.stdout and made["id"] in shown.stdout
    assert "timeout=90.0" in shown.stdout
    on_run = cli_server.json("overrides", "list", "--run", run_id)
    assert [o["id"] for o in on_run["items"]] == [made["id"], own["id"]]

    removed = cli_server.json("overrides", "remove", own["id"], "--run", run_id)
    assert removed["status"] == "removed"
    cleared = cli_server.cli("overrides", "clear", "--job", job_id, "--reason", "over")
    assert cleared.exit_code == 0 and "removed 1 override" in cleared.stdout
    run = cli_server.json("runs", "show", run_id)
    assert (run["payload"], run["override_ids"]) == ({"region": "eu", "old": 1}, [])
    ended = cli_server.json("overrides", "list", "--job", job_id, "--ended")
    assert sorted(o["status"] for o in ended["items"]) == ["removed", "removed"]


def test_bad_input_fails_clearly_and_changes_nothing(cli_server: Server) -> None:
    job = _yearly(cli_server)
    job_id, run_id = str(job["id"]), str(job["first_run_id"])
    for args, words in (
        (("add", "--job", job_id, "--timeout", "5"), "--scope must be next or future"),
        (("add", "--job", job_id, "--run", run_id, "--timeout", "5"), "one of them"),
        (("add", "--run", run_id, "--scope", "future", "--timeout", "5"), "its own scope"),
        (("add", "--job", job_id, "--scope", "next"), "changes nothing"),
        (("add", "--job", job_id, "--scope", "next", "--payload", "[1]"), "JSON object"),
        (("add", "--job", job_id, "--scope", "next", "--timeout", "-3"), "timeout"),
        (("list",), "one of them"),
        (("remove", "01234567-89ab-7def-8123-456789abcdef", "--job", job_id), "not found"),
    ):
        result = cli_server.cli("overrides", *args)
        assert result.exit_code != 0, (args, result.output)
        assert words in result.output, (args, result.output)
    listed = cli_server.json("overrides", "list", "--job", job_id, "--ended")
    assert listed["items"] == []
    run = cli_server.json("runs", "show", run_id)
    assert run["override_ids"] == []
