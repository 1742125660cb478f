"""Runs: history with filters, one run with its attempts and events, cancel, retry and
redrive; dead letters listed and redriven in bulk."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request

from cronwheel.api.auth import (
    TenantScope,
    actor_of,
    tenant_or_every_reader,
    tenant_reader,
    tenant_writer,
)
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.redaction import redact_webhook
from cronwheel.api.schemas import (
    ADDS_RUNS,
    ERROR_RESPONSES,
    AttemptOut,
    CancelRequest,
    DeadLetterRedriveOut,
    DeadLetterRedriveRequest,
    ErrorResponse,
    EventList,
    EventOut,
    RunDetail,
    RunList,
    RunOut,
    SkippedRun,
)
from cronwheel.api.state import api_state
from cronwheel.domain.bounds import Instant
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Attempt, Event, Run
from cronwheel.domain.states import REDRIVE, RETRY, RunState
from cronwheel.store import Store
from cronwheel.store.values import RunFilter

__all__ = [
    "attempt_out",
    "dead_letters",
    "event_out",
    "router",
    "run_fields",
    "run_out",
    "tags_filter",
]

router = APIRouter(
    prefix="/v1/runs", tags=["runs"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)

_EVENTS_PER_RUN = 500
_MAX_TAGS = 10


def _ms_between(start: datetime, end: datetime | None) -> float | None:
    if end is None:
        return None
    return round((end - start).total_seconds() * 1000, 3)


def run_fields(run: Run) -> dict[str, object]:
    return {
        "id": run.id,
        "tenant_id": run.tenant_id,
        "job_id": run.job_id,
        "job_name": run.job_name,
        "state": str(run.state),
        "origin": run.origin,
        "due_at": run.due_at,
        "due_local": run.due_local,
        "fire_at": run.fire_at,
        "created_at": run.created_at,
        "dispatched_at": run.dispatched_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        # Lateness is measured from fire_at, the instant this try was meant to go out:
        # for a first try it is the due instant, for a retry the end of its backoff.
        "dispatch_lateness_ms": _ms_between(run.fire_at, run.dispatched_at),
        "start_lateness_ms": _ms_between(run.fire_at, run.started_at),
        "priority": run.priority,
        "pool": run.pool,
        "requires": run.requires,
        "tags": run.tags,
        "route_tags": run.route_tags,
        "task": run.task,
        "webhook": redact_webhook(run.webhook),
        "override_ids": run.override_ids,
        "payload": run.payload,
        "attempt": run.attempt,
        "max_attempts": run.max_attempts,
        "timeout": run.timeout,
        "heartbeat_timeout": run.heartbeat_timeout,
        "progress_timeout": run.progress_timeout,
        "reason": run.reason,
        # Only a waiting run waits: a reason a cancel or pause left behind until the
        # next routing check is not shown.
        "wait_reason": run.wait_reason if run.state is RunState.DISPATCHED else None,
        "last_error": run.last_error,
        "result": run.result,
        "quarantined_at": run.quarantined_at,
        "workflow_run_id": run.workflow_run_id,
        "node": run.node or None,
    }


def run_out(run: Run) -> RunOut:
    return RunOut.model_validate(run_fields(run))


async def with_holds(store: Store, runs: list[Run]) -> list[Run]:
    """``runs``, each waiting run whose tenant a limit holds back now saying so in its
    ``wait_reason`` (a condition that changes at every lease and completion: read when
    asked, never written to the rows). Costs nothing when no run is waiting."""
    now = datetime.now(UTC)
    waiting = {
        r.id: r.tenant_id
        for r in runs
        if r.state is RunState.DISPATCHED and r.wait_reason is None and r.fire_at <= now
    }
    if not waiting:
        return runs
    held = await store.tenants_held(sorted(set(waiting.values())))
    return [
        dataclasses.replace(r, wait_reason=held[r.tenant_id])
        if r.id in waiting and r.tenant_id in held
        else r
        for r in runs
    ]


def attempt_out(attempt: Attempt) -> AttemptOut:
    return AttemptOut(
        id=attempt.id,
        number=attempt.number,
        state=str(attempt.state),
        worker_id=attempt.worker_id,
        worker_name=attempt.worker_name,
        fencing_token=attempt.fencing_token,
        # An attempt is made when its run is leased: its start is the lease.
        leased_at=attempt.started_at,
        duration_ms=_ms_between(attempt.started_at, attempt.finished_at),
        logs=f"/v1/runs/{attempt.run_id}/logs?attempt={attempt.number}",
        started_at=attempt.started_at,
        heartbeat_at=attempt.heartbeat_at,
        lease_expires_at=attempt.lease_expires_at,
        deadline=attempt.deadline,
        finished_at=attempt.finished_at,
        error=attempt.error,
        progress_at=attempt.progress_at,
        progress_details=attempt.progress_details,
        progress_deadline=attempt.progress_deadline,
        result=attempt.result,
    )


def event_out(event: Event) -> EventOut:
    return EventOut(
        id=event.id,
        at=event.at,
        kind=event.kind,
        attempt_id=event.attempt_id,
        from_state=event.from_state,
        to_state=event.to_state,
        actor=event.actor,
        reason=event.reason,
        data=event.data or {},
    )


def _states(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    # An empty name is refused like an unknown one: dropped, "state=" filtered nothing
    # and listed every run, where GET /v1/jobs refuses an empty state.
    names = [v.strip().upper() for value in values for v in value.split(",")]
    known = {s.value for s in RunState}
    for name in names:
        if name not in known:
            raise ValidationError(
                f"state: unknown run state {name!r}; one of {', '.join(sorted(known))}",
                field="state",
            )
    return names or None


@router.get("", summary="List runs")
async def list_runs(
    request: Request,
    tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader),
    job_id: uuid.UUID | None = Query(default=None),
    state: list[str] | None = Query(
        default=None, description="repeat the parameter or separate states by commas"
    ),
    since: Instant | None = Query(default=None, description="due at or after"),
    until: Instant | None = Query(default=None, description="due before"),
    tag: list[str] | None = Query(
        default=None, description="a tag the run carries; repeated: every one of them"
    ),
    pool: str | None = Query(default=None, min_length=1, max_length=100),
    cursor: str | None = Query(default=None, max_length=100),
    limit: int = Query(default=100, ge=1, le=500),
) -> RunList:
    """Newest first by due instant (then id); pass ``next_cursor`` as ``cursor`` for the
    next page. Keyset pages: runs added meanwhile never shift a later page. The admin
    key lists every tenant's runs, or one tenant's with the ``Cronwheel-Tenant`` header.
    Which filters are index-backed is in docs/history.md."""
    if since is not None and until is not None and until <= since:
        raise ValidationError("until: must be after 'since'", field="until")
    run_filter = RunFilter(
        job_id=job_id,
        states=_states(state),
        since=since,
        until=until,
        tags=tags_filter(tag),
        pool=pool,
    )
    page = await api_state(request).store.runs_list(
        tenant_id, filter=run_filter, cursor=cursor, limit=limit
    )
    runs = await with_holds(api_state(request).store, page.items)
    return RunList(items=[run_out(r) for r in runs], next_cursor=page.next_cursor)


def tags_filter(values: list[str] | None) -> list[str]:
    """The history's tag filter: each tag once, at most ten, each 1 to 100 characters."""
    tags = list(dict.fromkeys(values or ()))
    if len(tags) > _MAX_TAGS:
        raise ValidationError(f"tag: at most {_MAX_TAGS} tags, not {len(tags)}", field="tag")
    for tag in tags:
        if not tag or len(tag) > 100:
            raise ValidationError("tag: each tag is 1 to 100 characters", field="tag")
    return tags


@router.get("/{run_id}", summary="Read a run with its attempts and events")
async def get_run(
    run_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> RunDetail:
    """The run, each attempt with its timings, worker and where its logs are read, and
    the first events of its timeline (the rest: ``GET /v1/runs/{id}/events`` from
    ``events_next_cursor``)."""
    store = api_state(request).store
    [run] = await with_holds(
        store, [await store.runs_get(scope.tenant_id, parse_id(run_id, "run"))]
    )
    attempts = await store.attempts_list(scope.tenant_id, run_id=run.id)
    events = await store.events_list(scope.tenant_id, run_id=run.id, limit=_EVENTS_PER_RUN)
    return RunDetail.model_validate(
        {
            **run_fields(run),
            "attempts": [attempt_out(a) for a in attempts],
            "events": [event_out(e) for e in events.items],
            "events_next_cursor": events.next_cursor,
        }
    )


@router.get("/{run_id}/events", summary="Read a run's event timeline")
async def list_run_events(
    run_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    cursor: str | None = Query(default=None, max_length=20),
    limit: int = Query(default=100, ge=1, le=1000),
) -> EventList:
    """Every transition and operation of the run, oldest first; pass ``next_cursor`` as
    ``cursor`` for the next page (a run still going may add events after the last)."""
    store = api_state(request).store
    run = await store.runs_get(scope.tenant_id, parse_id(run_id, "run"))
    page = await store.events_list(scope.tenant_id, run_id=run.id, cursor=cursor, limit=limit)
    return EventList(items=[event_out(e) for e in page.items], next_cursor=page.next_cursor)


@router.post(
    "/{run_id}/cancel",
    summary="Cancel a run",
    responses={409: {"model": ErrorResponse, "description": "The run is already over"}},
)
async def cancel_run(
    run_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> RunOut:
    """A run not yet leased is cancelled at once; a running one is asked to stop and
    its worker learns it on its next heartbeat."""
    run = await api_state(request).store.runs_cancel(
        scope.tenant_id,
        parse_id(run_id, "run"),
        actor=actor_of(request, scope.principal),
        reason=body.reason if body else None,
    )
    return run_out(run)


_NOT_NOW: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "Not allowed in the run's state"}
}


@router.post(
    "/{run_id}/redrive",
    summary="Send a dead-lettered run back for a new series",
    responses={**_NOT_NOW, **ADDS_RUNS},
)
async def redrive_run(
    run_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> RunOut:
    """A DEAD_LETTER run is due again at once, with its retry policy's attempts anew
    (attempt numbers go on). Any other state answers 409."""
    run = await api_state(request).store.runs_redrive(
        scope.tenant_id,
        parse_id(run_id, "run"),
        move=REDRIVE,
        actor=actor_of(request, scope.principal),
        reason=(body.reason if body else None) or "redriven",
    )
    return run_out(run)


@router.post(
    "/{run_id}/retry", summary="Run a finished run again", responses={**_NOT_NOW, **ADDS_RUNS}
)
async def retry_run(
    run_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> RunOut:
    """A FAILED, CANCELLED or DEAD_LETTER run is due again at once, with its retry
    policy's attempts anew. A run that succeeded, was skipped or is still going answers
    409."""
    run = await api_state(request).store.runs_redrive(
        scope.tenant_id,
        parse_id(run_id, "run"),
        move=RETRY,
        actor=actor_of(request, scope.principal),
        reason=(body.reason if body else None) or "retried",
    )
    return run_out(run)


dead_letters = APIRouter(
    prefix="/v1/dead-letters", tags=["runs"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)


@dead_letters.get("", summary="List dead-lettered runs")
async def list_dead_letters(
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    job_id: uuid.UUID | None = Query(default=None),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
) -> RunList:
    """Runs that gave up after their last attempt, newest first; each carries its last
    error and the reason. Redrive one with ``POST /v1/runs/{id}/redrive``, many with
    ``POST /v1/dead-letters/redrive``."""
    run_filter = RunFilter(job_id=job_id, states=[RunState.DEAD_LETTER.value])
    page = await api_state(request).store.runs_list(
        scope.tenant_id, filter=run_filter, cursor=cursor, limit=limit
    )
    return RunList(items=[run_out(r) for r in page.items], next_cursor=page.next_cursor)


@dead_letters.post(
    "/redrive",
    summary="Send dead-lettered runs back in bulk",
    responses={404: {"model": ErrorResponse, "description": "No such job"}, **ADDS_RUNS},
)
async def redrive_dead_letters(
    request: Request,
    body: DeadLetterRedriveRequest,
    scope: TenantScope = Depends(tenant_writer),
) -> DeadLetterRedriveOut:
    """Each selected DEAD_LETTER run is due again at once with a new series of attempts,
    as ``POST /v1/runs/{id}/redrive`` does one; at most ``limit``, oldest first, in one
    transaction. Select with exactly one of ``run_ids``, ``job_id`` or ``all: true``. A
    named run that is not one of the tenant's dead letters is reported in ``skipped``;
    it does not fail the batch."""
    chosen = {"run_ids": body.run_ids is not None, "job_id": body.job_id is not None}
    given = [name for name, yes in {**chosen, "all": body.all}.items() if yes]
    if not given:
        raise ValidationError(
            "run_ids: select the dead letters with one of run_ids, job_id or all: true",
            field="run_ids",
        )
    if len(given) > 1:
        raise ValidationError(
            f"{given[1]}: give only one of run_ids, job_id or all (got {' and '.join(given)})",
            field=given[1],
        )
    batch = await api_state(request).store.runs_redrive_many(
        scope.tenant_id,
        run_ids=body.run_ids,
        job_id=body.job_id,
        limit=body.limit,
        actor=actor_of(request, scope.principal),
        reason=body.reason or "redriven",
    )
    return DeadLetterRedriveOut(
        redriven=len(batch.runs),
        run_ids=[r.id for r in batch.runs],
        skipped=[
            SkippedRun(run_id=run_id, reason=reason) for run_id, reason in batch.skipped.items()
        ],
        more=batch.more,
    )
