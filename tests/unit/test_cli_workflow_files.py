"""What ``cronwheel workflows create -f`` refuses of a file before sending it: anything
that could not go as the JSON it reads as, said with the file and the place, never a
traceback or a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import typer

from cronwheel.cli.options import parse_json_object
from cronwheel.cli.workflows import read_spec


def _refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(typer.Exit) as caught:
        read_spec(str(path))
    assert caught.value.exit_code == 1
    return " ".join(capsys.readouterr().err.split())


def _node(payload: str) -> str:
    head = "name: x\nschedule: {asap: true}\nnodes:\n"
    return head + f"  - {{name: a, task: t, payload: {payload}}}\n"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_nesting_past_what_python_reads_is_refused(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text('{"name": "x", "nodes": ' + "[" * 5000 + "]" * 5000 + "}")
    said = _refused(path, capsys)
    assert f"{path} nests deeper than the server takes (32 levels)" in said


def test_nesting_past_the_servers_bound_is_refused_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(_node("{v: " + "[" * 40 + "]" * 40 + "}"))
    said = _refused(path, capsys)
    assert f"{path}: nodes.0.payload.v" in said and "nests deeper than 32 levels" in said


def test_aliases_that_stand_for_millions_of_values_are_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nname: x\nschedule: {asap: true}\nnodes: [*a8]\n")
    began = time.monotonic()
    said = _refused(path, capsys)
    assert "holds more than 2,000,000 values once its aliases are expanded" in said
    assert time.monotonic() - began < 30  # a bound, not a measure: it used to hang


@pytest.mark.parametrize(
    ("payload", "key"),
    [("{1: first, '1': second}", "1"), ("{~: was-null}", "None"), ("{true: yes}", "True")],
)
def test_a_key_that_is_not_text_is_refused(
    payload: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Sent, 1 would become "1" beside "1" (one value lost), ~ the text "None".
    path = tmp_path / "keys.yaml"
    path.write_text(_node(payload))
    said = _refused(path, capsys)
    assert f"the key {key} of nodes.0.payload is not text: quote it" in said


def test_a_good_file_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(_node("{'1': one, deep: [[[1]]], at: '12:00'}"))
    spec = read_spec(str(path))
    assert spec["nodes"][0]["payload"] == {"1": "one", "deep": [[[1]]], "at": "12:00"}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"x": NaN}', "not valid JSON: NaN is not a number in JSON"),
        ('{"x": -Infinity}', "not valid JSON: -Infinity is not a number in JSON"),
        ('{"x": 1, "x": 2}', "not valid JSON: the key 'x' is given twice in one object"),
    ],
)
def test_a_json_option_takes_json_only(text: str, said: str) -> None:
    # --payload and its kin: refused there, naming the option, not later by the sender.
    with pytest.raises(typer.BadParameter) as caught:
        parse_json_object(text, "--payload")
    assert caught.value.format_message() == f"Invalid value for '--payload': {said}"
