"""Workflows: DAGs of nodes scheduled like jobs (``domain/workflow.py``, docs/workflows.md).

A workflow is stored as a job, so pausing, resuming, cancelling, triggering and deleting
one are its job's operations, answered here as a workflow. Its workflow runs are read
with their node runs; cancelling one cancels its nodes, and retrying a node continues
the run from there."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response, status
from pydantic import Field

from cronwheel.api.auth import TenantScope, actor_of, tenant_reader, tenant_writer
from cronwheel.api.inputs import FORCE_QUERY, IDEMPOTENCY_KEY_HEADER, REASON_QUERY, parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.redaction import redact_webhook, refuse_redacted
from cronwheel.api.routers.jobs import delete_job, jobs_page
from cronwheel.api.schemas import (
    ERROR_RESPONSES,
    CancelRequest,
    ErrorResponse,
    JobControlRequest,
    JobDeletedOut,
    RequestModel,
    ResponseModel,
    TriggerRequest,
    UtcInstant,
)
from cronwheel.api.state import api_state
from cronwheel.domain.errors import ConflictError, NotFoundError, ValidationError
from cronwheel.domain.model import Job, Run
from cronwheel.domain.states import RETRY, TERMINAL_STATES, RunState
from cronwheel.domain.workflow import (
    Dag,
    WorkflowSpec,
    check_trigger_payload,
    dag_of,
    new_workflow,
)
from cronwheel.store.base import Store

__all__ = ["router", "runs_router", "workflow_out", "workflow_run_out"]

router = APIRouter(
    prefix="/v1/workflows",
    tags=["workflows"],
    responses=ERROR_RESPONSES,
    route_class=StrictJsonRoute,
)
runs_router = APIRouter(
    prefix="/v1/workflow-runs",
    tags=["workflows"],
    responses=ERROR_RESPONSES,
    route_class=StrictJsonRoute,
)


class NodeOut(ResponseModel):
    name: str
    after: list[str]
    trigger_rule: str
    task: str | None
    webhook: dict[str, Any] | None
    payload: dict[str, Any]
    pool: str
    requires: list[str]
    tags: list[str]
    route_tags: list[str]
    priority: int
    retry: dict[str, Any]
    timeout: float
    heartbeat_timeout: float
    progress_timeout: float | None


class WorkflowOut(ResponseModel):
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    state: str = Field(description="active | paused | cancelled | finished")
    schedule: dict[str, Any]
    next_due_at: UtcInstant | None
    tags: list[str]
    lateness_budget: float
    nodes: list[NodeOut]
    version: int
    created_at: UtcInstant
    updated_at: UtcInstant
    first_run_id: uuid.UUID | None = Field(
        default=None, description="on creation: the first workflow run"
    )


class WorkflowList(ResponseModel):
    items: list[WorkflowOut]
    next_cursor: str | None


class NodeRunOut(ResponseModel):
    node: str
    run_id: uuid.UUID | None
    state: str = Field(
        description="PENDING (waiting for its upstream nodes) | SCHEDULED | DISPATCHED | "
        "RUNNING | SUCCESS | FAILED | DEAD_LETTER | CANCELLED | SKIPPED"
    )
    reason: str | None = Field(description="why it waits, was skipped, failed or cancelled")
    after: list[str]
    trigger_rule: str
    attempt: int
    max_attempts: int
    task: str | None
    pool: str
    fire_at: UtcInstant | None = Field(description="when it became ready (or will fire)")
    started_at: UtcInstant | None
    finished_at: UtcInstant | None
    result: Any = None
    last_error: str | None


class WorkflowRunOut(ResponseModel):
    id: uuid.UUID
    workflow_id: uuid.UUID
    workflow_name: str
    state: str = Field(description="SCHEDULED | RUNNING | SUCCESS | FAILED | CANCELLED | …")
    origin: str
    due_at: UtcInstant
    fire_at: UtcInstant
    started_at: UtcInstant | None
    finished_at: UtcInstant | None
    reason: str | None
    payload: dict[str, Any] = Field(description="merged over every node's payload")
    counts: dict[str, int] = Field(description="its nodes by state")
    nodes: list[NodeRunOut] | None = Field(
        default=None, description="its nodes in definition order (not in listings)"
    )


class WorkflowRunList(ResponseModel):
    items: list[WorkflowRunOut]
    next_cursor: str | None


class NodeRetryRequest(RequestModel):
    reason: str | None = Field(default=None, max_length=1000)


def workflow_out(job: Job, *, first_run_id: uuid.UUID | None = None) -> WorkflowOut:
    assert job.workflow is not None
    dag = dag_of(job.id, job.workflow)
    return WorkflowOut(
        id=job.id,
        tenant_id=job.tenant_id,
        name=job.name,
        state=str(job.state),
        schedule=job.schedule,
        next_due_at=job.next_due_at,
        tags=job.template.tags,
        lateness_budget=job.template.lateness_budget,
        nodes=[_node_out(n.name, n.after, n.trigger_rule, n.template) for n in dag.nodes],
        version=job.version,
        created_at=job.created_at,
        updated_at=job.updated_at,
        first_run_id=first_run_id,
    )


def _node_out(name: str, after: tuple[str, ...], rule: str, t: Any) -> NodeOut:
    return NodeOut(
        name=name,
        after=list(after),
        trigger_rule=rule,
        task=t.task,
        webhook=redact_webhook(t.webhook),
        payload=t.payload,
        pool=t.pool,
        requires=t.requires,
        tags=t.tags,
        route_tags=t.route_tags,
        priority=t.priority,
        retry=t.retry,
        timeout=t.timeout,
        heartbeat_timeout=t.heartbeat_timeout,
        progress_timeout=t.progress_timeout,
    )


def workflow_run_out(
    run: Run, dag: Dag, nodes: list[Run] | None, *, with_nodes: bool = True
) -> WorkflowRunOut:
    """The workflow run ``run`` with its ``nodes`` (None: not started, none yet)."""
    by_name = {n.node: n for n in nodes or []}
    counts = Counter(str(n.state) for n in by_name.values())
    # A workflow run's nodes are made when it starts. Before, they wait; if it ended
    # without starting (cancelled, skipped by its catch-up policy), none ever runs.
    unborn, why = "PENDING", None
    if run.state in TERMINAL_STATES and not by_name:
        unborn, why = "SKIPPED", f"the workflow run ended {run.state} before it started"
    items: list[NodeRunOut] = []
    for node in dag.nodes:
        n = by_name.get(node.name)
        items.append(
            NodeRunOut(
                node=node.name,
                run_id=None if n is None else n.id,
                state=unborn if n is None else str(n.state),
                reason=why if n is None else n.reason,
                after=list(node.after),
                trigger_rule=node.trigger_rule,
                attempt=0 if n is None else n.attempt,
                max_attempts=node.template.max_attempts if n is None else n.max_attempts,
                task=node.template.task,
                pool=node.template.pool,
                fire_at=None if n is None or n.state is RunState.PENDING else n.fire_at,
                started_at=None if n is None else n.started_at,
                finished_at=None if n is None else n.finished_at,
                result=None if n is None else n.result,
                last_error=None if n is None else n.last_error,
            )
        )
    if not by_name:
        counts = Counter({unborn: len(dag.nodes)})
    return WorkflowRunOut(
        id=run.id,
        workflow_id=run.job_id,
        workflow_name=run.job_name,
        state=str(run.state),
        origin=run.origin,
        due_at=run.due_at,
        fire_at=run.fire_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        reason=run.reason,
        payload=run.payload,
        counts=dict(counts),
        nodes=items if with_nodes else None,
    )


async def _workflow(store: Store, tenant_id: uuid.UUID, workflow_id: uuid.UUID) -> Job:
    """The workflow, or 404 (a job that is not a workflow is not one)."""
    try:
        job = await store.jobs_get(tenant_id, workflow_id)
    except NotFoundError:
        job = None
    if job is None or job.workflow is None:
        raise NotFoundError(
            f"workflow {workflow_id} not found", workflow_id=str(workflow_id)
        ) from None
    return job


async def _workflow_run(
    store: Store, tenant_id: uuid.UUID, run_id: uuid.UUID
) -> tuple[Run, Dag, list[Run]]:
    """The workflow run with its DAG and node runs, or 404."""
    try:
        run = await store.runs_get(tenant_id, run_id)
    except NotFoundError:
        run = None
    job = None
    if run is not None and run.workflow_run_id is None and run.node == "":
        try:
            job = await store.jobs_get(tenant_id, run.job_id)
        except NotFoundError:
            job = None
    if run is None or job is None or job.workflow is None:
        raise NotFoundError(f"workflow run {run_id} not found", run_id=str(run_id))
    nodes = (await store.workflow_run_nodes(tenant_id, [run.id]))[run.id]
    return run, dag_of(job.id, job.workflow), nodes


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a workflow",
    response_model=WorkflowOut,
    responses={
        200: {
            "model": WorkflowOut,
            "description": "The Idempotency-Key was used before with "
            "the same request: the workflow created then",
        },
        409: {
            "model": ErrorResponse,
            "description": "The Idempotency-Key was used before "
            "with a different request (`idempotency_conflict`)",
        },
    },
)
async def create_workflow(
    request: Request,
    response: Response,
    spec: WorkflowSpec = Body(),
    scope: TenantScope = Depends(tenant_writer),
    idempotency_key: str | None = IDEMPOTENCY_KEY_HEADER,
) -> WorkflowOut:
    """Validates the DAG — no cycle (the error names its nodes), every `after` a node of
    the workflow, unique node names, at most 2,000 nodes — and stores the workflow with
    its first workflow run in one transaction; nothing is stored when anything is
    wrong (422). With an Idempotency-Key used before, the workflow created then (200),
    or 409 when that request was another."""
    for i, node in enumerate(spec.nodes):
        refuse_redacted(node, field=f"nodes.{i}.webhook.headers")
    state = api_state(request)
    now = await state.store.db_now_estimate()
    new = new_workflow(
        spec,
        now=now,
        limits=state.settings.job_limits,
        actor=actor_of(request, scope.principal),
        idempotency_key=idempotency_key,
    )
    job, run, created = await state.store.workflows_create(scope.tenant_id, new=new, now=now)
    if not created:
        response.status_code = status.HTTP_200_OK
    return workflow_out(job, first_run_id=None if run is None else run.id)


@router.get("", summary="List workflows", response_model=WorkflowList)
async def list_workflows(
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    state: str | None = Query(default=None, description="active | paused | cancelled | finished"),
    tag: str | None = Query(default=None, max_length=100),
    name_prefix: str | None = Query(default=None, max_length=200),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=50, ge=1, le=200),
) -> WorkflowList:
    """Newest first; pass ``next_cursor`` as ``cursor`` for the next page. ``state``
    and ``tag`` keep the workflows in that state, or with that tag."""
    page = await jobs_page(
        request,
        scope,
        state=state,
        tag=tag,
        name_prefix=name_prefix,
        cursor=cursor,
        limit=limit,
        workflows=True,
    )
    return WorkflowList(items=[workflow_out(j) for j in page.items], next_cursor=page.next_cursor)


@router.get("/{workflow_id}", summary="Get a workflow", response_model=WorkflowOut)
async def get_workflow(
    workflow_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> WorkflowOut:
    store = api_state(request).store
    return workflow_out(await _workflow(store, scope.tenant_id, parse_id(workflow_id, "workflow")))


async def _control(
    request: Request, scope: TenantScope, workflow_id: str, action: str, reason: str | None
) -> WorkflowOut:
    store = api_state(request).store
    ident = parse_id(workflow_id, "workflow")
    await _workflow(store, scope.tenant_id, ident)
    actor = actor_of(request, scope.principal)
    if action == "pause":
        job = await store.jobs_pause(scope.tenant_id, ident, actor=actor, reason=reason)
    elif action == "resume":
        job = await store.jobs_resume(scope.tenant_id, ident, actor=actor, reason=reason)
    else:
        job = await store.jobs_cancel(scope.tenant_id, ident, actor=actor, reason=reason)
    return workflow_out(job)


@router.post("/{workflow_id}/pause", summary="Pause a workflow", response_model=WorkflowOut)
async def pause_workflow(
    workflow_id: str,
    request: Request,
    body: JobControlRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowOut:
    """No workflow run fires while paused; in the runs going, nodes that become ready
    wait for the resume (those running finish). 409 unless active."""
    return await _control(request, scope, workflow_id, "pause", body.reason if body else None)


@router.post("/{workflow_id}/resume", summary="Resume a workflow", response_model=WorkflowOut)
async def resume_workflow(
    workflow_id: str,
    request: Request,
    body: JobControlRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowOut:
    """Held workflow runs and nodes go again, as a resumed job's runs do. 409 unless
    paused."""
    return await _control(request, scope, workflow_id, "resume", body.reason if body else None)


@router.post("/{workflow_id}/cancel", summary="Cancel a workflow", response_model=WorkflowOut)
async def cancel_workflow(
    workflow_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowOut:
    """The workflow fires no more; its workflow runs going are cancelled (their running
    nodes asked to stop)."""
    return await _control(request, scope, workflow_id, "cancel", body.reason if body else None)


@router.post(
    "/{workflow_id}/trigger",
    status_code=status.HTTP_201_CREATED,
    summary="Run a workflow now",
    response_model=WorkflowRunOut,
)
async def trigger_workflow(
    workflow_id: str,
    request: Request,
    body: TriggerRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowRunOut:
    """A workflow run due now (origin `trigger`); `payload` is merged over every node's
    payload: 422 if it takes the key of the upstream results, 413 if a node's payload
    would exceed the payload limit. 409 for a cancelled workflow."""
    state = api_state(request)
    ident = parse_id(workflow_id, "workflow")
    job = await _workflow(state.store, scope.tenant_id, ident)
    assert job.workflow is not None
    if body is not None and body.payload is not None:
        check_trigger_payload(
            dag_of(job.id, job.workflow), body.payload, limit=state.settings.max_payload_bytes
        )
    run = await state.store.jobs_trigger(
        scope.tenant_id,
        ident,
        actor=actor_of(request, scope.principal),
        payload=body.payload if body else None,
        max_payload_bytes=state.settings.max_payload_bytes,
    )
    return workflow_run_out(run, dag_of(job.id, job.workflow), None)


@router.delete("/{workflow_id}", summary="Delete a workflow", response_model=JobDeletedOut)
async def delete_workflow(
    workflow_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_writer),
    force: bool = FORCE_QUERY,
    reason: str | None = REASON_QUERY,
) -> JobDeletedOut:
    """Deletes the workflow with all its runs, as deleting a job does (409 `in_use`
    while one of its runs goes, unless `force=true`)."""
    ident = parse_id(workflow_id, "workflow")
    await _workflow(api_state(request).store, scope.tenant_id, ident)
    return await delete_job(workflow_id, request, scope, force=force, reason=reason)


@router.get("/{workflow_id}/runs", summary="List a workflow's runs", response_model=WorkflowRunList)
async def list_workflow_runs(
    workflow_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    state: str | None = Query(
        default=None, max_length=200, description="one state, or several separated by commas"
    ),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=50, ge=1, le=200),
) -> WorkflowRunList:
    """Newest first, each with its nodes counted by state."""
    store = api_state(request).store
    ident = parse_id(workflow_id, "workflow")
    job = await _workflow(store, scope.tenant_id, ident)
    states = [s for s in (state or "").split(",") if s]
    # A workflow run is fired like a run and then runs: never waiting as a node does.
    known = {s.value for s in RunState if s is not RunState.PENDING}
    for s in states:
        if s not in known:
            raise ValidationError(
                f"state: {s!r} is not a workflow run's state; one of {', '.join(sorted(known))}",
                field="state",
            )
    page = await store.workflow_runs_list(
        scope.tenant_id, ident, states=states, cursor=cursor, limit=limit
    )
    nodes = await store.workflow_run_nodes(scope.tenant_id, [r.id for r in page.items])
    assert job.workflow is not None
    dag = dag_of(job.id, job.workflow)
    return WorkflowRunList(
        items=[
            workflow_run_out(r, dag, nodes.get(r.id) or None, with_nodes=False) for r in page.items
        ],
        next_cursor=page.next_cursor,
    )


@runs_router.get("/{run_id}", summary="Get a workflow run", response_model=WorkflowRunOut)
async def get_workflow_run(
    run_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> WorkflowRunOut:
    """The workflow run and each of its nodes: state, why it waits or was skipped,
    attempts, result. A node's run is a run: its attempts and events are at
    `/v1/runs/{run_id}/attempts` and `/v1/runs/{run_id}/events`."""
    store = api_state(request).store
    run, dag, nodes = await _workflow_run(store, scope.tenant_id, parse_id(run_id, "run"))
    return workflow_run_out(run, dag, nodes or None)


@runs_router.post(
    "/{run_id}/cancel", summary="Cancel a workflow run", response_model=WorkflowRunOut
)
async def cancel_workflow_run(
    run_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowRunOut:
    """Its waiting and ready nodes are cancelled and its running ones asked to stop
    (cooperatively); it ends CANCELLED when they have."""
    store = api_state(request).store
    ident = parse_id(run_id, "run")
    await _workflow_run(store, scope.tenant_id, ident)
    await store.runs_cancel(
        scope.tenant_id,
        ident,
        actor=actor_of(request, scope.principal),
        reason=(body.reason if body else None) or "workflow run cancelled",
    )
    run, dag, nodes = await _workflow_run(store, scope.tenant_id, ident)
    return workflow_run_out(run, dag, nodes or None)


@runs_router.post(
    "/{run_id}/nodes/{node}/retry",
    summary="Retry a node and continue the workflow run",
    response_model=WorkflowRunOut,
)
async def retry_node(
    run_id: str,
    node: str,
    request: Request,
    body: NodeRetryRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> WorkflowRunOut:
    """A FAILED, DEAD_LETTER or CANCELLED node runs again (a new series of attempts)
    once its trigger rule holds over its upstream nodes (at once if it does now); the
    nodes it had skipped or cancelled downstream wait for it again, and a finished
    workflow run, or one being cancelled, runs on from there. 409 for a node in any
    other state, or one whose rule can no longer hold (retry its upstream nodes first)."""
    store = api_state(request).store
    ident = parse_id(run_id, "run")
    run, _dag, nodes = await _workflow_run(store, scope.tenant_id, ident)
    found = next((n for n in nodes if n.node == node), None)
    if found is None and node in _dag.by_name:
        raise ConflictError(
            f"workflow run {run_id} ended {run.state} before it started: its nodes never "
            "ran, so there is nothing to retry (trigger the workflow to run it again)"
            if run.state in TERMINAL_STATES
            else f"workflow run {run_id} has not started: its nodes run once it fires",
            node=node,
        )
    if found is None:
        raise NotFoundError(f"workflow run {run_id} has no node {node!r}", node=node)
    if found.state not in RETRY.sources:
        raise ConflictError(
            f"node {node!r} is {found.state}; only a FAILED, DEAD_LETTER or CANCELLED node "
            "can be retried",
            node=node,
        )
    await store.runs_redrive(
        scope.tenant_id,
        found.id,
        move=RETRY,
        actor=actor_of(request, scope.principal),
        reason=(body.reason if body else None) or f"node {node} retried",
    )
    run, dag, nodes = await _workflow_run(store, scope.tenant_id, ident)
    return workflow_run_out(run, dag, nodes or None)
