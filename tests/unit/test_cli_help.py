"""Every ``cronwheel`` command's ``--help``: paragraphs flow to the terminal's width,
defaults show as ``[default: …]`` (never swallowed as markup), and ``--version``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cronwheel.cli import app
from cronwheel.version import package_version

runner = CliRunner()


def _commands() -> Iterator[tuple[list[str], Any]]:
    """Every command and group (Typer's own click commands), with the words naming it."""
    root = typer.main.get_command(app)
    todo: list[tuple[list[str], Any]] = [([], root)]
    while todo:
        path, command = todo.pop()
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            todo.append(([*path, name], sub))


COMMANDS = sorted(_commands(), key=lambda item: item[0])


def _help(path: list[str], columns: int = 250) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def _prose(command: Any) -> list[str]:
    """The paragraphs of a command's own help (not code), as single lines."""
    text = inspect.cleandoc(command.help or "")
    out = []
    for paragraph in text.split("\n\n"):
        if paragraph.startswith("    ") or "\n    " in paragraph:
            continue  # a code example keeps its lines
        out.append(" ".join(paragraph.replace("`", "").split()))
    return out


def test_every_command_is_reached() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"jobs delete", "tenants delete", "jobs create", "db upgrade", "server"} <= names
    assert len(names) > 30


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "cronwheel" for p, _ in COMMANDS]
)
def test_help_flows_paragraphs_and_keeps_defaults(path: list[str], command: Any) -> None:
    shown = _help(path)
    lines = [" ".join(line.strip(" │╭╮╰╯─").split()) for line in shown.splitlines()]
    for paragraph in _prose(command):
        if len(paragraph) < 200:  # fits one line at this width: it must be on one
            assert any(paragraph in line for line in lines), (paragraph, shown)
    # A default or a bracket in a help text is never eaten, leaving a space before a stop.
    assert not re.search(r"\w \.(\s|$)", shown), shown


def test_defaults_are_shown() -> None:
    shown = " ".join(_help(["jobs", "create"]).replace("│", " ").split())
    for default in ("UTC", "first", "shift", "coalesce", "allow", "default", "POST"):
        assert f"[default: ({default})]" in shown, default
    assert "Unix epoch (1970-01-01T00:00:00Z)" in shown and "--every 60" in shown


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"cronwheel {package_version()}"
    assert package_version() != "0.0.0"
