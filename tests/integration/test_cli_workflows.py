"""``cronwheel workflows …`` against a real server (API and scheduler) on both backends:
a workflow made from examples/pipeline.yaml, its runs worked by the real worker SDK and
shown as trees; files and requests the server refuses, as messages and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_server import CLI_ADMIN_KEY, Server
from rich.console import Console
from workflow_work import EtlTasks, work_until_over

from cronwheel import Client
from cronwheel.cli.workflows import run_tree
from cronwheel.worker import NonRetryableError, TaskContext, Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.yaml"
NODES = ("extract", "transform_a", "transform_b", "load")


def _worker_key(cli_server: Server) -> str:
    with Client(cli_server.url, api_key=CLI_ADMIN_KEY) as admin:
        made = admin.tenants.create_key(cli_server.tenant_id, role="worker")
    key: str = made["api_key"]
    return key


def _ok(cli_server: Server, *args: str) -> str:
    result = cli_server.cli(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def _created(cli_server: Server, path: Path, text: str) -> dict[str, Any]:
    """The workflow ``cronwheel workflows create -f`` makes of ``text``, written at ``path``."""
    path.write_text(text)
    made: dict[str, Any] = cli_server.json("workflows", "create", "-f", str(path))
    return made


def _refused(cli_server: Server, *args: str) -> str:
    result = cli_server.cli(*args)
    assert result.exit_code == 1 and result.stdout == "", result.output
    return " ".join(result.stderr.split())


def test_the_example_pipeline_is_created_listed_and_shown(cli_server: Server) -> None:
    out = _ok(cli_server, "workflows", "create", "-f", str(EXAMPLE))
    workflow = cli_server.json("workflows", "list")["items"][0]
    assert f"created workflow {workflow['id']} (etl-hourly) of 4 nodes, next due" in out
    assert workflow["schedule"]["cron"] == "0 * * * *" and workflow["tags"] == ["etl"]

    listed = _ok(cli_server, "workflows", "list")
    row = next(line for line in listed.splitlines() if workflow["id"] in line)
    assert "etl-hourly" in row and "active" in row and "cron 0 * * * * Europe/Paris" in row

    shown = _ok(cli_server, "workflows", "get", workflow["id"])
    load = next(line for line in shown.splitlines() if "etl.load" in line)
    assert "transform_a, transform_b" in load and "all_success" in load
    got = cli_server.json("workflows", "get", workflow["id"])
    assert [n["name"] for n in got["nodes"]] == ["extract", "transform_a", "transform_b", "load"]
    assert got["nodes"][0]["retry"]["max_attempts"] == 3


def test_a_json_file_and_standard_input(cli_server: Server, tmp_path: Path) -> None:
    body = {
        "name": "from-json",
        "schedule": {"delay": 3600},
        "nodes": [{"name": "only", "task": "t"}],
    }
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(body))
    made = cli_server.json("workflows", "create", "--file", str(path))
    assert made["name"] == "from-json" and [n["name"] for n in made["nodes"]] == ["only"]

    result = cli_server.cli("workflows", "create", "-f", "-", "--json", input=EXAMPLE.read_text())
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "etl-hourly"


def test_yaml_anchors_and_merge_keys_share_node_fields(cli_server: Server, tmp_path: Path) -> None:
    # Fields shared through an anchor and ``<<``; a key beside it overrides one of its
    # own (name, timeout): that is not a key given twice.
    made = _created(
        cli_server,
        tmp_path / "anchors.yaml",
        "name: shared\nschedule: {delay: 3600}\nnodes:\n"
        "  - &d {name: first, task: etl.step, timeout: 60}\n"
        "  - {<<: *d, name: a}\n"
        "  - {<<: *d, name: b, after: [a, first], timeout: 120}\n",
    )
    fields = {n["name"]: (n["task"], n["timeout"], n["after"]) for n in made["nodes"]}
    assert fields == {
        "first": ("etl.step", 60, []),
        "a": ("etl.step", 60, []),
        "b": ("etl.step", 120, ["a", "first"]),
    }


def test_bad_files_and_refused_workflows(cli_server: Server, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    assert f"cannot read {missing}" in _refused(
        cli_server, "workflows", "create", "-f", str(missing)
    )

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nnodes: [a, b\nschedule: {}\n")
    said = _refused(cli_server, "workflows", "create", "-f", str(broken))
    assert f"{broken} is not valid YAML" in said and "(line " in said

    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"name": "x",}')
    said = _refused(cli_server, "workflows", "create", "-f", str(bad_json))
    assert f"{bad_json} is not valid JSON" in said and "line 1" in said

    # A key given twice is refused, not read as its last value (a node's second
    # ``after`` would drop its first); NaN and infinities are not JSON numbers.
    for name, text, expected in (
        (
            "twice.yaml",
            "name: x\nschedule: {asap: true}\nnodes:\n"
            "  - name: b\n    task: t\n    after: [a]\n    after: []\n  - {name: a, task: t}\n",
            "is not valid YAML: the key 'after' is given twice (line 7, column 5)",
        ),
        (
            "twice.json",
            '{"name": "x",\n "nodes": [{"name": "a", "task": "t", "after": [], "after": ["b"]}]}',
            "the key 'after' is given twice in one object (line 2, column 52)",
        ),
        (
            "nan.yaml",
            "name: x\nschedule: {asap: true}\nnodes:\n  - {name: a, task: t, payload: {v: .inf}}\n",
            "nan.yaml: nodes.0.payload.v is inf, which is not a number in JSON",
        ),
        ("nan.json", '{"name": "x", "nodes": [NaN]}', "NaN is not a number in JSON"),
        (
            "no-day.yaml",
            "name: x\nschedule: {at: 2031-02-30T00:00:00Z}\nnodes: []\n",
            "no-day.yaml is not valid YAML: day is out of range for month",
        ),
    ):
        path = tmp_path / name
        path.write_text(text)
        said = _refused(cli_server, "workflows", "create", "-f", str(path))
        assert expected in said, said

    a_list = tmp_path / "list.yaml"
    a_list.write_text("- name: x\n")
    said = _refused(cli_server, "workflows", "create", "-f", str(a_list))
    assert "must hold one workflow: a mapping with name, schedule and nodes" in said

    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(
        "name: loop\nschedule: {asap: true}\nnodes:\n"
        "  - {name: a, task: t, after: [b]}\n  - {name: b, task: t, after: [a]}\n"
    )
    said = _refused(cli_server, "workflows", "create", "-f", str(cycle))
    assert "cycle" in said and "[invalid_request]" in said

    bad_field = tmp_path / "field.yaml"
    bad_field.write_text(
        "name: f\nschedule: {asap: true}\nnodes:\n  - {name: a, task: t, timeout: -1}\n"
    )
    said = _refused(cli_server, "workflows", "create", "-f", str(bad_field))
    assert "(field nodes.0.timeout)" in said
    assert cli_server.json("workflows", "list")["items"] == []


def _node_line(shown: str, node: str) -> str:
    return next(line for line in shown.splitlines() if f" {node}  " in line)


def test_a_run_is_shown_as_a_tree_retried_and_listed(cli_server: Server) -> None:
    workflow = cli_server.json("workflows", "create", "-f", str(EXAMPLE))
    out = _ok(cli_server, "workflows", "trigger", workflow["id"], "--payload", '{"day": "d1"}')
    runs = cli_server.json("workflows", "runs", workflow["id"])["items"]
    [run] = [r for r in runs if r["origin"] == "trigger"]
    assert f"triggered workflow run {run['id']} of workflow {workflow['id']}" in out

    tasks = EtlTasks("b")
    worker = tasks.worker(cli_server.url, _worker_key(cli_server))
    with Client(cli_server.url, api_key=cli_server.operator_key) as client:
        failed = work_until_over(worker, lambda: client.workflows.run(run["id"]))
    assert failed["state"] == "FAILED"

    shown = _ok(cli_server, "workflows", "show", run["id"])
    lines = shown.splitlines()
    assert f"workflow run {run['id']} (etl-hourly) FAILED" in " ".join(lines[0].split())
    extract, a, b, load = (_node_line(shown, n) for n in NODES)
    assert "SUCCESS" in extract and "attempt 1/3" in extract and " s " in extract
    assert "SUCCESS" in a and "FAILED" in b and "part b is broken" in b
    assert "SKIPPED" in load and "upstream failed: transform_b" in load
    assert "(after transform_a, transform_b)" in load
    # The tree: extract at the top, the transforms under it, load under transform_a,
    # and under transform_b a line pointing there.
    depth = {n: _node_line(shown, n).index(n) for n in NODES}
    assert depth["extract"] < depth["transform_a"] == depth["transform_b"] < depth["load"]
    assert lines.index(load) == lines.index(a) + 1
    pointer = lines[lines.index(b) + 1]
    assert "↳ load (also after this; shown under transform_a)" in pointer
    node_ids = {n["node"]: n["run_id"] for n in failed["nodes"]}
    assert node_ids["transform_b"] in b  # for cronwheel runs logs

    # Each state in its colour.
    console = Console(record=True, force_terminal=True, color_system="standard", width=200)
    console.print(run_tree(failed))
    styled = console.export_text(styles=True)
    assert "\x1b[1;31mFAILED" in styled and "\x1b[32mSUCCESS" in styled

    table = _ok(cli_server, "workflows", "runs", workflow["id"])
    row = next(line for line in table.splitlines() if run["id"] in line)
    assert "FAILED" in row and "trigger" in row and "1 FAILED, 1 SKIPPED, 2 SUCCESS" in row

    said = _refused(cli_server, "workflows", "retry", run["id"], "transform_a")
    assert "node 'transform_a' is SUCCESS" in said and "[conflict]" in said

    tasks.failing.clear()
    retried = _ok(cli_server, "workflows", "retry", run["id"], "transform_b", "--reason", "fixed")
    assert "RUNNING" in retried.splitlines()[0] and "PENDING" in _node_line(retried, "load")
    with Client(cli_server.url, api_key=cli_server.operator_key) as client:
        work_until_over(worker, lambda: client.workflows.run(run["id"]))
    done = cli_server.json("workflows", "show", run["id"])
    assert done["state"] == "SUCCESS" and {n["state"] for n in done["nodes"]} == {"SUCCESS"}
    assert tasks.payloads["load"][-1]["day"] == "d1"
    assert "4 SUCCESS" in _ok(cli_server, "workflows", "show", run["id"])


def test_control_cancel_a_run_and_delete(cli_server: Server, tmp_path: Path) -> None:
    workflow = _created(
        cli_server,
        tmp_path / "idle.yaml",
        "name: idle\nschedule: {cron: '0 3 * * *'}\nnodes:\n"
        "  - {name: first, task: not.served}\n"
        "  - {name: second, task: not.served, after: [first]}\n",
    )
    wid = workflow["id"]
    assert f"paused workflow {wid} (idle)" in _ok(
        cli_server, "workflows", "pause", wid, "--reason", "r"
    )
    assert cli_server.json("workflows", "get", wid)["state"] == "paused"
    assert f"resumed workflow {wid} (idle)" in _ok(cli_server, "workflows", "resume", wid)

    run: dict[str, Any] = cli_server.json("workflows", "trigger", wid)
    shown = _ok(cli_server, "workflows", "cancel-run", run["id"], "--reason", "not today")
    assert "CANCELLED" in _node_line(shown, "second")
    assert cli_server.json("workflows", "show", run["id"])["nodes"][1]["state"] == "CANCELLED"

    assert f"cancelled workflow {wid} (idle)" in _ok(cli_server, "workflows", "cancel", wid)
    deleted = _ok(cli_server, "workflows", "delete", wid, "--reason", "done")
    assert f"deleted workflow {wid} (idle) with " in deleted
    assert "not_found" in _refused(cli_server, "workflows", "get", wid)
    assert "not_found" in _refused(cli_server, "workflows", "show", run["id"])
    assert cli_server.json("workflows", "list")["items"] == []


def test_a_long_chain_is_shown_whole_in_a_narrow_terminal(
    cli_server: Server, tmp_path: Path
) -> None:
    # 30 nodes one after the other, the fourth failing with a long error: at 80
    # columns every node is shown (deep branches go on from the top level, saying so)
    # and the error wraps instead of being cut at the edge.
    steps = [f"step{i:02d}" for i in range(30)]
    spec = {
        "name": "long-chain",
        "schedule": {"delay": 3600},
        "nodes": [
            {
                "name": s,
                "task": "chain.step",
                "after": steps[i - 1 : i],
                "retry": {"max_attempts": 1},
            }
            for i, s in enumerate(steps)
        ],
    }
    workflow = _created(cli_server, tmp_path / "chain.json", json.dumps(spec))
    run = cli_server.json("workflows", "trigger", workflow["id"])
    error = "the third step found the ledger locked by another writer and gave up at once"

    def step(ctx: TaskContext, payload: dict[str, Any]) -> None:
        if "step02" in payload.get("upstream", {}):
            raise NonRetryableError(error)

    worker = Worker(cli_server.url, api_key=_worker_key(cli_server), lease_wait=0.5)
    worker.task("chain.step")(step)
    with Client(cli_server.url, api_key=cli_server.operator_key) as client:
        failed = work_until_over(worker, lambda: client.workflows.run(run["id"]))
    assert failed["state"] == "FAILED"

    result = cli_server.cli("workflows", "show", run["id"], COLUMNS="80")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    shown = " ".join(result.stdout.split())
    for s in steps:
        assert f" {s} " in shown, s
    assert error in " ".join(w for w in shown.split() if w not in "│├└──")
    assert "↳ step06 goes on from the top level, below" in shown
    assert "step06 SKIPPED (after step05, above)" in shown
    for node in failed["nodes"]:
        assert node["run_id"] in result.stdout  # each id whole, on one line
