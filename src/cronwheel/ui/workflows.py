"""The workflows pages: the list (schedule in words, state, next due, node count), a
workflow's page — its DAG and its latest workflow runs — and a workflow run's page: its
DAG drawn with each node coloured by its run's state and linked to that run's page, a
table of its nodes, and the buttons that cancel the workflow run and retry a node.
Reads and buttons alike go through the API's own workflow routes (the same checks, the
same history and audit trail)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from cronwheel.api.routers import workflows as workflows_api
from cronwheel.api.routers.workflows import NodeOut, NodeRunOut
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.states import RETRY, RunState
from cronwheel.domain.workflow import NODES_MAX, may_hold
from cronwheel.ui.dag import NodeLook, dag_svg, layered
from cronwheel.ui.jobs import PAGE_SIZE
from cronwheel.ui.render import UiRoute, first_line, page, redirect, svg
from cronwheel.ui.sessions import Visit, checked_form, signed_in
from cronwheel.ui.words import schedule_in_words

__all__ = ["NODE_ROWS", "NODE_STATES", "definition_svg", "router", "run_svg"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

_RECENT_RUNS = 10
NODE_ROWS = 200  # the node table's rows at most; the DAG above shows every node
# A node run's states, the order a wide layer keeps them in when it folds the rest:
# what needs looking at first.
NODE_STATES = [s.value for s in (
    RunState.FAILED, RunState.DEAD_LETTER, RunState.CANCELLED, RunState.RUNNING,
    RunState.DISPATCHED, RunState.SCHEDULED, RunState.PENDING, RunState.SKIPPED,
    RunState.SUCCESS,
)]  # fmt: skip
_RANK = {state: i for i, state in enumerate(NODE_STATES)}
_RETRYABLE = frozenset(s.value for s in RETRY.sources)  # what the API's node retry takes
_LIVE_RUN = frozenset({RunState.SCHEDULED.value, RunState.RUNNING.value})

# What each button of a workflow does, and the route of the API that does it.
_ACTIONS: dict[str, tuple[Callable[..., Awaitable[Any]], str]] = {
    "pause": (workflows_api.pause_workflow, "Paused"),
    "resume": (workflows_api.resume_workflow, "Resumed"),
    "cancel": (workflows_api.cancel_workflow, "Cancelled"),
}


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


def definition_svg(nodes: Sequence[NodeOut], *, label: str) -> str:
    """A workflow's DAG as defined: each node with its task and, when it is not the
    default, its trigger rule."""
    looks = {}
    for node in nodes:
        rule = node.trigger_rule
        detail = node.task or "webhook"
        looks[node.name] = NodeLook(
            state=None,
            detail=detail if rule == "all_success" else f"{detail} · {rule}",
            tip=f"task {detail}, runs after {', '.join(node.after) or 'nothing'} ({rule})",
        )
    return dag_svg(layered([(n.name, n.after) for n in nodes]), looks, label=label)


def run_svg(nodes: Sequence[NodeRunOut], *, label: str) -> str:
    """A workflow run's DAG: each node coloured by its run's state, linked to its run's
    page; a wide layer keeps its failed and running nodes in sight and folds the rest."""
    looks = {}
    for node in nodes:
        attempts = f"attempt {node.attempt}/{node.max_attempts}" if node.attempt else ""
        why = first_line(node.reason or node.last_error, 160)
        looks[node.node] = NodeLook(
            state=node.state,
            detail=" · ".join(x for x in (node.state, attempts) if x),
            href=f"/ui/runs/{node.run_id}" if node.run_id else None,
            tip=node.state + (f": {why}" if why else ""),
        )
    layout = layered(
        [(n.node, n.after) for n in nodes],
        rank=lambda name: _RANK.get(str(looks[name].state), len(_RANK)),
    )
    return dag_svg(layout, looks, label=label)


@dataclass(frozen=True, slots=True)
class _Counts:
    """A workflow run's node counts by state, in the order of :data:`NODE_STATES`."""

    items: list[tuple[str, int]]

    @classmethod
    def of(cls, counts: dict[str, int]) -> _Counts:
        known = [(s, counts[s]) for s in NODE_STATES if counts.get(s)]
        other = [(s, n) for s, n in sorted(counts.items()) if s not in _RANK and n]
        return cls(known + other)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.items)


@router.get("/workflows")
async def workflows_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    name: str = Query(default="", max_length=200),
    cursor: str = Query(default="", max_length=500),
    notice: str = Query(default="", max_length=200),
) -> Response:
    found = await workflows_api.list_workflows(
        request=request,
        scope=visit.scope,
        state=None,
        tag=None,
        name_prefix=name.strip() or None,
        cursor=cursor or None,
        limit=PAGE_SIZE,
    )
    return page(
        "workflows.html",
        visit,
        title="Workflows",
        section="workflows",
        notice=notice,
        workflows=[(w, w.state, schedule_in_words(w.schedule)) for w in found.items],
        next_cursor=found.next_cursor,
        paged=bool(cursor),
        name=name,
    )


@router.get("/workflows/{workflow_id}")
async def workflow_page(
    workflow_id: str,
    request: Request,
    visit: Visit = Depends(signed_in),
    notice: str = Query(default="", max_length=200),
) -> Response:
    scope = visit.scope
    workflow = await workflows_api.get_workflow(
        workflow_id=workflow_id, request=request, scope=scope
    )
    runs = await workflows_api.list_workflow_runs(
        workflow_id=workflow_id,
        request=request,
        scope=scope,
        state=None,
        cursor=None,
        limit=_RECENT_RUNS,
    )
    state = workflow.state
    return page(
        "workflow.html",
        visit,
        title=workflow.name,
        section="workflows",
        notice=notice,
        workflow=workflow,
        state=state,
        words=schedule_in_words(workflow.schedule),
        zone=workflow.schedule.get("timezone", "UTC"),
        graph=svg(definition_svg(workflow.nodes, label=f"the nodes of {workflow.name}")),
        runs=[(r, r.state, _Counts.of(r.counts)) for r in runs.items],
        more_runs=runs.next_cursor is not None,
        may_pause=state == "active",
        may_resume=state == "paused",
        may_trigger=state != "cancelled",
        may_cancel=state in ("active", "paused"),
    )


@router.get("/workflow-runs/{run_id}")
async def workflow_run_page(
    run_id: str,
    request: Request,
    visit: Visit = Depends(signed_in),
    state: str = Query(default="", max_length=20),
    name: str = Query(default="", max_length=100),
    start: int = Query(default=0, ge=0, le=NODES_MAX),
    notice: str = Query(default="", max_length=200),
) -> Response:
    """A workflow run: its DAG drawn, and its node runs listed ``NODE_ROWS`` at a time
    from ``start``, by state and by a part of their name."""
    if state and state not in _RANK:
        raise ValidationError(f"state: unknown node state {state!r}", field="state")
    run = await workflows_api.get_workflow_run(run_id=run_id, request=request, scope=visit.scope)
    nodes = run.nodes or []
    chosen = [n for n in nodes if (not state or n.state == state) and name in n.node]
    states = {n.node: RunState(n.state) for n in nodes}
    rows = [
        {
            "node": n,
            "state": n.state,
            "took": _seconds(n.started_at, n.finished_at),
            # What the API's node retry takes: failed or cancelled, its rule still able
            # to hold over its upstream nodes.
            "may_retry": n.state in _RETRYABLE
            and may_hold(n.trigger_rule, [states[u] for u in n.after]),
        }
        for n in chosen[start : start + NODE_ROWS]
    ]
    counts = _Counts.of(run.counts)
    return page(
        "workflow_run.html",
        visit,
        title=f"Run of {run.workflow_name}",
        section="workflows",
        notice=notice,
        run=run,
        run_state=run.state,
        counts=counts,
        graph=svg(run_svg(nodes, label=f"the nodes of workflow run {run.id}")),
        rows=rows,
        start=start,
        page_size=NODE_ROWS,
        matching=len(chosen),
        state=state,
        name=name,
        states=[s for s, _ in counts.items],
        took=_seconds(run.started_at, run.finished_at),
        may_cancel=run.state in _LIVE_RUN,
    )


@router.post("/workflows/{workflow_id}/{action}")
async def workflow_action(
    workflow_id: str, action: str, request: Request, visit: Visit = Depends(signed_in)
) -> Response:
    """A button of the list or of the workflow's page: the API's own route does the
    work; the list's buttons lead back to the list."""
    form = await checked_form(request, visit)
    scope = visit.writer_scope()
    if action == "trigger":
        run = await workflows_api.trigger_workflow(
            workflow_id=workflow_id, request=request, body=None, scope=scope
        )
        return redirect(f"/ui/workflow-runs/{run.id}?notice=Triggered")
    if action not in _ACTIONS:
        raise ValidationError(f"unknown action {action!r}", field="action")
    route, done = _ACTIONS[action]
    workflow = await route(workflow_id=workflow_id, request=request, body=None, scope=scope)
    if form.one("back") == "list":
        return redirect(f"/ui/workflows?notice={done}")
    return redirect(f"/ui/workflows/{workflow.id}?notice={done}")


@router.post("/workflow-runs/{run_id}/cancel")
async def workflow_run_cancel(
    run_id: str, request: Request, visit: Visit = Depends(signed_in)
) -> Response:
    await checked_form(request, visit)
    run = await workflows_api.cancel_workflow_run(
        run_id=run_id, request=request, body=None, scope=visit.writer_scope()
    )
    return redirect(f"/ui/workflow-runs/{run.id}?notice=Cancelled")


@router.post("/workflow-runs/{run_id}/retry")
async def workflow_run_retry(
    run_id: str, request: Request, visit: Visit = Depends(signed_in)
) -> Response:
    """The retry button of a node (its name a form field: a name such as ``..`` would
    not survive in a path)."""
    form = await checked_form(request, visit)
    node = form.one("node")
    if not node:
        raise ValidationError("node: name the node to retry", field="node")
    run = await workflows_api.retry_node(
        run_id=run_id, node=node, request=request, body=None, scope=visit.writer_scope()
    )
    return redirect(f"/ui/workflow-runs/{run.id}?notice=Retried")
