"""``cronwheel workflows …``: create a workflow from a YAML or JSON file, list, show and
control workflows (pause, resume, cancel, trigger, delete), list their runs, show a
workflow run as a tree of its nodes, cancel it, retry one of its nodes."""

from __future__ import annotations

import contextlib
import json
import math
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Group
from rich.markup import escape
from rich.text import Text
from rich.tree import Tree

from cronwheel.cli.options import (
    DEFAULT_URL,
    ApiKeyOpt,
    CursorOpt,
    JsonOpt,
    ReasonOpt,
    TenantOpt,
    UrlOpt,
    client_for,
    parse_json_object,
)
from cronwheel.cli.output import (
    PIPE_WIDTH,
    command_group,
    console,
    count,
    err,
    fail,
    handle_errors,
    key_values,
    print_json,
    short_time,
    table,
)
from cronwheel.cli.schedule import schedule_text
from cronwheel.domain.bounds import JSON_DEPTH_MAX
from cronwheel.jsontext import KeyTwiceError, pairs_once

__all__ = [
    "STATE_STYLES",
    "IdArg",
    "RunIdArg",
    "read_spec",
    "run_tree",
    "workflows_app",
    "workflows_cancel",
    "workflows_cancel_run",
    "workflows_create",
    "workflows_delete",
    "workflows_get",
    "workflows_list",
    "workflows_pause",
    "workflows_resume",
    "workflows_retry",
    "workflows_runs",
    "workflows_show",
    "workflows_trigger",
]

workflows_app = command_group(
    "Workflows: DAGs of tasks scheduled like a job. Create one from a YAML or JSON file, "
    "list, show and control them; follow their runs node by node, cancel a run, retry a "
    "node."
)

IdArg = Annotated[str, typer.Argument(help="The workflow id.")]
RunIdArg = Annotated[str, typer.Argument(help="The workflow run id.")]

# How each run state shows in a workflow run's tree.
STATE_STYLES = {
    "PENDING": "dim",
    "SCHEDULED": "magenta",
    "DISPATCHED": "blue",
    "RUNNING": "bold cyan",
    "SUCCESS": "green",
    "FAILED": "bold red",
    "DEAD_LETTER": "bold red",
    "CANCELLED": "yellow",
    "SKIPPED": "dim yellow",
}
# States whose reason (or last error) says what went wrong.
# Files this large are read under a spinner.
_LARGE_FILE = 1_000_000
# Values a file may hold, its aliases expanded: more than a request's 1 MiB could carry
# (each value is a byte at least).
_VALUES_MAX = 2_000_000
# The fewest levels a workflow run's tree shows before a branch goes on from the top.
_TREE_DEPTH_MIN = 4
_EXPLAINED = frozenset({"FAILED", "DEAD_LETTER", "CANCELLED", "SKIPPED"})


def read_spec(path: str) -> dict[str, Any]:
    """The workflow a file describes, in the shape of ``POST /v1/workflows``'s body:
    JSON when the name ends in ``.json``, otherwise YAML (``-``: standard input).
    Fails with a message naming the file and where it is wrong."""
    where = "standard input" if path == "-" else path
    try:
        text = typer.get_text_stream("stdin").read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        fail(f"cannot read {where}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{where} is not UTF-8 text")
    try:
        with _reading(where, len(text)):
            if path.endswith(".json"):
                spec = json.loads(text, object_pairs_hook=pairs_once, parse_constant=_no_constant)
            else:
                spec = yaml.load(text, Loader=_SpecLoader)  # a SafeLoader
    except RecursionError:
        fail(f"{where} nests deeper than the server takes ({JSON_DEPTH_MAX} levels)")
    except json.JSONDecodeError as exc:
        fail(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(exc, "problem", None) or str(exc)
        fail(f"{where} is not valid YAML: {problem}{at}")
    except KeyTwiceError as exc:
        fail(f"{where} is not valid JSON: {exc}{_place_of_twice(text)}")
    except ValueError as exc:  # NaN in JSON; a YAML date that is no day
        fail(f"{where} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}")
    if not isinstance(spec, dict):
        fail(
            f"{where} must hold one workflow: a mapping with name, schedule and nodes "
            "(see examples/pipeline.yaml)"
        )
    problem = _unsendable(spec)
    if problem is not None:
        fail(f"{where}: {problem}")
    return spec


@contextlib.contextmanager
def _reading(where: str, size: int) -> Iterator[None]:
    """A spinner while a large file is read (a few MB of YAML take seconds)."""
    if size < _LARGE_FILE:
        yield
        return
    with err.status(f"reading {where} ({size / 1e6:.1f} MB) …"):
        yield


def _place_of_twice(text: str) -> str:
    """Where a JSON text gives a key twice, `` (line L, column C)``, as the YAML reader
    finds it (JSON's gives no place to the hook that sees it; JSON is YAML but for
    rare corners, where this says nothing)."""
    try:
        yaml.load(text, Loader=_SpecLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None and "given twice" in str(getattr(exc, "problem", "")):
            return f" (line {mark.line + 1}, column {mark.column + 1})"
    return ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number in JSON")


def _unsendable(value: Any) -> str | None:
    """What in ``value`` could not be sent as the JSON it reads as, with where it is
    (``nodes.0.payload.x``): a NaN or an infinity (YAML writes them ``.nan``,
    ``.inf``), a key that is not text (YAML's ``1:`` or ``~:`` would be sent as
    ``"1"`` and ``"None"``, and ``1`` beside ``"1"`` would lose one), nesting deeper
    than the server takes, or more values than any request holds (YAML aliases
    repeat what they name: a few lines can stand for millions)."""
    todo: list[tuple[str, Any, int]] = [("", value, 0)]
    seen = 0
    while todo:
        where, item, depth = todo.pop()
        seen += 1
        if seen > _VALUES_MAX:
            return f"holds more than {_VALUES_MAX:,} values once its aliases are expanded"
        if isinstance(item, float) and not math.isfinite(item):
            return f"{where} is {item!r}, which is not a number in JSON"
        if isinstance(item, dict | list) and depth >= JSON_DEPTH_MAX:
            return f"{where or 'the workflow'} nests deeper than {JSON_DEPTH_MAX} levels"
        if isinstance(item, dict):
            for k in item:
                if not isinstance(k, str):
                    return f"the key {k!r} of {where or 'the workflow'} is not text: quote it"
            todo += [(f"{where}.{k}".lstrip("."), v, depth + 1) for k, v in reversed(item.items())]
        elif isinstance(item, list):
            todo += [
                (f"{where}.{i}".lstrip("."), v, depth + 1)
                for i, v in reversed(list(enumerate(item)))
            ]
    return None


class _SpecLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML has no types)
    """YAML as safe_load reads it, but a key given twice in one mapping is an error
    (safe_load keeps the last: a node's second ``after`` would drop the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *defaults``: keys given beside it override its own
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"the key {key!r} is given twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return dict(super().construct_mapping(node, deep=deep))


@workflows_app.command("create")
def workflows_create(
    file: Annotated[
        str,
        typer.Option(
            "--file",
            "-f",
            help="The workflow as YAML, or JSON when the name ends in .json (- reads "
            "standard input), in the shape of POST /v1/workflows's body: name, schedule, "
            "nodes (each with after and trigger_rule), tags, lateness_budget.",
        ),
    ],
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a workflow from a file (e.g. examples/pipeline.yaml). A cycle, a node
    after an unknown node or a bad field is refused, naming where, and nothing is
    created."""
    spec = read_spec(file)
    with handle_errors(), client_for(url, api_key, tenant) as client:
        workflow = client.workflows.create(spec)
    if as_json:
        print_json(workflow)
        return
    console.print(
        f"[green]created[/] workflow [bold]{workflow['id']}[/] ({escape(workflow['name'])}) "
        f"of {count(len(workflow.get('nodes') or []), 'node')}, "
        f"next due {short_time(workflow.get('next_due_at')) or '—'}",
        highlight=False,
    )
    if workflow.get("first_run_id"):
        console.print(f"workflow run {workflow['first_run_id']}", highlight=False)


@workflows_app.command("list")
def workflows_list(
    state: Annotated[
        str | None,
        typer.Option("--state", help="active | paused | cancelled | finished", show_default=False),
    ] = None,
    tag: Annotated[str | None, typer.Option("--tag", show_default=False)] = None,
    name_prefix: Annotated[str | None, typer.Option("--name-prefix", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Workflows, newest first."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.workflows.list(
            state=state, tag=tag, name_prefix=name_prefix, limit=limit, cursor=cursor
        )
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    rows = [
        (
            w["id"],
            w["name"],
            w["state"],
            schedule_text(w.get("schedule") or {}),
            len(w.get("nodes") or []),
            short_time(w.get("next_due_at")),
        )
        for w in page.items
    ]
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    console.print(
        table(
            f"workflows ({len(rows)})",
            ["id", "name", "state", "schedule", "nodes", "next due"],
            rows,
            caption=caption,
        )
    )


@workflows_app.command("get")
def workflows_get(
    workflow_id: IdArg,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One workflow and its nodes."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        workflow = client.workflows.get(workflow_id)
    if as_json:
        print_json(workflow)
        return
    nodes = workflow.pop("nodes", None) or []
    console.print(key_values(f"workflow {workflow['id']}", workflow))
    console.print(
        table(
            f"nodes ({len(nodes)})",
            ["node", "after", "trigger rule", "task", "pool", "prio"],
            [
                (
                    n["name"],
                    ", ".join(n.get("after") or []),
                    n.get("trigger_rule"),
                    n.get("task") or ("webhook" if n.get("webhook") else ""),
                    n.get("pool"),
                    "" if n.get("priority") is None else f"P{n['priority']}",
                )
                for n in nodes
            ],
        )
    )


def _said(verb: str, style: str, workflow: Mapping[str, Any]) -> None:
    console.print(
        f"[{style}]{verb}[/] workflow [bold]{workflow['id']}[/] ({escape(workflow['name'])})",
        highlight=False,
    )


_CONTROLS = {
    "pause": ("paused", "yellow"),
    "resume": ("resumed", "green"),
    "cancel": ("cancelled", "yellow"),
}


def _control(
    action: str,
    workflow_id: str,
    reason: str | None,
    url: str,
    api_key: str | None,
    tenant: str | None,
    *,
    as_json: bool,
) -> None:
    """Pause, resume or cancel a workflow, and say so."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        workflow = getattr(client.workflows, action)(workflow_id, reason=reason)
    if as_json:
        print_json(workflow)
        return
    said, colour = _CONTROLS[action]
    _said(said, colour, workflow)


@workflows_app.command("pause")
def workflows_pause(
    workflow_id: IdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause a workflow: it fires no new run until it is resumed."""
    _control("pause", workflow_id, reason, url, api_key, tenant, as_json=as_json)


@workflows_app.command("resume")
def workflows_resume(
    workflow_id: IdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a paused workflow."""
    _control("resume", workflow_id, reason, url, api_key, tenant, as_json=as_json)


@workflows_app.command("cancel")
def workflows_cancel(
    workflow_id: IdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a workflow: it fires no more."""
    _control("cancel", workflow_id, reason, url, api_key, tenant, as_json=as_json)


@workflows_app.command("trigger")
def workflows_trigger(
    workflow_id: IdArg,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            help="A JSON object merged over each node's payload.",
            show_default=False,
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a workflow now, outside its schedule."""
    merged = None if payload is None else parse_json_object(payload, "--payload")
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.workflows.trigger(workflow_id, payload=merged)
    if as_json:
        print_json(run)
        return
    console.print(
        f"[green]triggered[/] workflow run [bold]{run['id']}[/] of workflow "
        f"{run['workflow_id']}: cronwheel workflows show {run['id']}",
        highlight=False,
    )


@workflows_app.command("delete")
def workflows_delete(
    workflow_id: IdArg,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Also end its runs in progress (otherwise the deletion is refused)."
        ),
    ] = False,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a workflow with its runs (workflow runs and node runs) and their history.
    Refused while one of its runs goes, unless --force ends it."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        out = client.workflows.delete(workflow_id, force=force, reason=reason)
    if as_json:
        print_json(out)
        return
    stopped = out.get("runs_stopped") or []
    ended = f", {len(stopped)} of them in progress" if stopped else ""
    console.print(
        f"[red]deleted[/] workflow [bold]{out['id']}[/] ({escape(out['name'])}) with "
        f"{count(out['runs_deleted'], 'run')}{ended}",
        highlight=False,
    )


# -- workflow runs ---------------------------------------------------------------------


def _counts(counts: Mapping[str, int] | None) -> Text:
    """How many nodes are in each state: ``2 PENDING, 1 SUCCESS``, each in its colour."""
    out = Text()
    for state, number in sorted((counts or {}).items()):
        if number:
            out.append(", " if out else "")
            out.append(f"{number} {state}", STATE_STYLES.get(state, ""))
    return out


@workflows_app.command("runs")
def workflows_runs(
    workflow_id: IdArg,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            help="A workflow run state (SCHEDULED, RUNNING, SUCCESS, FAILED, CANCELLED), "
            "or several separated by commas.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: CursorOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A workflow's runs, newest first, with how many of their nodes are in each state."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        page = client.workflows.runs(workflow_id, state=state, limit=limit, cursor=cursor)
    if as_json:
        print_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    caption = f"more: --cursor {page.next_cursor}" if page.next_cursor else None
    rows = [
        (
            r["id"],
            r["state"],
            r.get("origin"),
            short_time(r.get("due_at")),
            short_time(r.get("started_at")),
            short_time(r.get("finished_at")),
            _counts(r.get("counts")).plain,
        )
        for r in page.items
    ]
    console.print(
        table(
            f"workflow runs ({len(rows)})",
            ["id", "state", "origin", "due", "started", "finished", "nodes"],
            rows,
            caption=caption,
        )
    )


def _seconds(node: Mapping[str, Any]) -> str:
    start, end = node.get("started_at"), node.get("finished_at")
    if not start or not end:
        return ""
    spent = (_instant(end) - _instant(start)).total_seconds()
    if spent < 60:
        return f"{spent:.1f} s"
    minutes, seconds = divmod(round(spent), 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _node_label(node: Mapping[str, Any], joined: Sequence[str], *, resumed: bool = False) -> Text:
    """``resumed``: drawn at the top level though it has upstream nodes (its branch
    went on from there)."""
    state = str(node.get("state", ""))
    label = Text.assemble((str(node["node"]), "bold"), "  ", (state, STATE_STYLES.get(state, "")))
    if node.get("attempt"):
        label.append(f"  attempt {node['attempt']}/{node.get('max_attempts', '?')}")
    took = _seconds(node)
    if took:
        label.append(f"  {took}")
    if len(joined) > 1 or resumed:
        label.append(f"  (after {', '.join(joined)}{', above' if resumed else ''})", "italic")
    if state in _EXPLAINED:
        # One line: a traceback's last names the exception.
        told = (node.get("reason") or node.get("last_error") or "").splitlines()
        why = next((line.strip() for line in reversed(told) if line.strip()), "")
        if why:
            label.append(f"  {why}", STATE_STYLES.get(state, ""))
    elif node.get("reason"):  # why it waits
        label.append(f"  {node['reason']}", "dim")
    if node.get("run_id"):
        label.append(f"  {node['run_id']}", "dim")
    return label


def run_tree(run: Mapping[str, Any], *, width: int | None = None) -> Tree:
    """A workflow run as a tree: the run at the root, each node under its first
    upstream node (a root node under the run) with its downstream nodes below it. A
    node with several upstream nodes is drawn once, under the first, saying which it
    waits for; under each other one it is a line pointing there. For a terminal
    ``width`` columns wide, a branch deeper than a third of it goes on from the top
    level, below the rest (a line says so where it left off): a long chain's nodes
    would otherwise be indented past the edge, and lost."""
    nodes: list[Mapping[str, Any]] = list(run.get("nodes") or [])
    state = str(run.get("state", ""))
    title = Text.assemble(
        ("workflow run ", "bold"),
        (str(run["id"]), "bold"),
        f" ({run.get('workflow_name') or run.get('workflow_id')})  ",
        (state, STATE_STYLES.get(state, "")),
    )
    if run.get("reason"):
        title.append(f"  {run['reason']}", "dim")
    root = Tree(title)
    below: dict[str, list[Mapping[str, Any]]] = {}
    for node in nodes:
        for upstream in node.get("after") or []:
            below.setdefault(upstream, []).append(node)
    # Each level indents by four columns.
    deepest = max(_TREE_DEPTH_MIN, (width or PIPE_WIDTH) // 12)
    # Depth first without recursion (a chain may be 2,000 nodes long), in the
    # workflow's order; pointers go after a node's own children, once all are drawn.
    pointers: list[tuple[Tree, Text]] = []
    todo: list[tuple[Tree, Mapping[str, Any], int]] = [
        (root, n, 1) for n in reversed(nodes) if not n.get("after")
    ]
    resumed: deque[Mapping[str, Any]] = deque()  # branches going on from the top level
    while todo or resumed:
        if not todo:
            todo.append((root, resumed.popleft(), 1))
        parent, node, depth = todo.pop()
        name = node["node"]
        after = node.get("after") or []
        branch = parent.add(_node_label(node, after, resumed=depth == 1 and bool(after)))
        children = below.get(name, [])
        own = [c for c in children if c["after"][0] == name]
        if depth < deepest:
            todo += [(branch, c, depth + 1) for c in reversed(own)]
        else:
            resumed += own
            pointers += [
                (branch, Text(f"↳ {c['node']} goes on from the top level, below", "dim"))
                for c in own
            ]
        pointers += [
            (branch, Text(f"↳ {c['node']} (also after this; shown under {c['after'][0]})", "dim"))
            for c in children
            if c["after"][0] != name
        ]
    for branch, pointer in pointers:
        branch.add(pointer)
    return root


def _print_run(run: Mapping[str, Any]) -> None:
    line = Text.assemble(
        f"due {short_time(run.get('due_at'))}",
        f"  started {short_time(run.get('started_at')) or '—'}",
        f"  finished {short_time(run.get('finished_at')) or '—'}  ",
        _counts(run.get("counts")),
    )
    # Wrapped, not cut: a long reason or error goes on to the next line, within the
    # tree (ids have no spaces, so each stays whole on its line).
    tree = run_tree(run, width=console.width)
    console.print(Group(tree, line), highlight=False, soft_wrap=False)


@workflows_app.command("show")
def workflows_show(
    run_id: RunIdArg,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A workflow run as a tree of its nodes: each node's state, attempts, duration
    and why it failed or was skipped, its node run id (for cronwheel runs logs), and
    below it the nodes that run after it."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.workflows.run(run_id)
    if as_json:
        print_json(run)
        return
    _print_run(run)


@workflows_app.command("cancel-run")
def workflows_cancel_run(
    run_id: RunIdArg,
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a workflow run: its waiting nodes are cancelled, running ones asked to
    stop."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.workflows.cancel_run(run_id, reason=reason)
    if as_json:
        print_json(run)
        return
    _print_run(run)


@workflows_app.command("retry")
def workflows_retry(
    run_id: RunIdArg,
    node: Annotated[str, typer.Argument(help="The node's name.")],
    reason: ReasonOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a failed, dead-lettered or cancelled node of a workflow run again; the nodes
    it had skipped or cancelled downstream wait for it again, and the workflow run goes
    on from there."""
    with handle_errors(), client_for(url, api_key, tenant) as client:
        run = client.workflows.retry_node(run_id, node, reason=reason)
    if as_json:
        print_json(run)
        return
    _print_run(run)
