"""The worker protocol: register, lease (long-poll), heartbeat, complete, fail, release,
deregister; and the list of workers operators read.

Every call about an attempt carries its fencing token; a stale one (the lease was lost
and the run handed to someone else) answers 409 ``stale_fencing_token`` and changes
nothing. Tenant keys only reach their own tenant's workers and attempts: anything else
is 404, exactly like an unknown id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response

from cronwheel.api.auth import Principal, require_worker, tenant_or_every_reader
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse
from cronwheel.api.state import ApiState, api_state
from cronwheel.api.worker_schemas import (
    AttemptRef,
    AttemptResultOut,
    BatchOut,
    BatchRequest,
    CompleteRequest,
    FailRequest,
    FencedRequest,
    HeartbeatItemIn,
    HeartbeatOut,
    HeartbeatRequest,
    LeasedAttemptOut,
    LeaseOut,
    LeaseRequest,
    OutcomeOut,
    StartOut,
    StartRequest,
    WorkerDeregistered,
    WorkerList,
    WorkerOut,
    WorkerRegister,
    WorkerRegistered,
)
from cronwheel.domain.bounds import LABEL_MAX
from cronwheel.domain.errors import (
    NotFoundError,
    StaleFencingTokenError,
    ValidationError,
    WorkerDeregisteredError,
)
from cronwheel.domain.model import AttemptOutcome, LeasedAttempt, Worker, WorkerStatus
from cronwheel.domain.new_job import check_json_size
from cronwheel.metrics import observe_start_lateness
from cronwheel.store.values import CompleteItem, FailItem, HeartbeatItem

__all__ = ["router"]

router = APIRouter(tags=["worker protocol"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute)
log = logging.getLogger("cronwheel.api")

_STALE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "Stale fencing token; nothing changed"}
}
_GONE: dict[int | str, dict[str, Any]] = {
    410: {
        "model": ErrorResponse,
        "description": "The worker was deregistered (`worker_deregistered`): it gets no "
        "run any more; register again for a new worker id",
    }
}

Item = TypeVar("Item", HeartbeatItem, CompleteItem, FailItem)


# -- registration and leasing ----------------------------------------------------------


@router.post("/v1/workers", summary="Register a worker")
async def register_worker(
    body: WorkerRegister, request: Request, principal: Principal = Depends(require_worker)
) -> WorkerRegistered:
    """A worker key with a tenant registers a worker of that tenant; a key without one
    (or the admin key) registers a worker that serves every tenant of its pool. A worker
    that names its ``tasks`` is leased runs of those tasks only; one that names none,
    any."""
    if body.webhooks_only and body.tasks:
        raise ValidationError("tasks: a worker with webhooks_only runs no tasks", field="tasks")
    state = api_state(request)
    worker = await state.store.workers_register(
        principal.tenant_id,
        pool=body.pool,
        capabilities=body.capabilities,
        tags=body.tags,
        capacity=body.capacity,
        name=body.name,
        webhooks_only=body.webhooks_only,
        tasks=body.tasks,
    )
    state.workers.put(worker.id, worker)
    return WorkerRegistered(
        worker_id=worker.id,
        tenant_id=worker.tenant_id,
        tasks=worker.tasks,
        heartbeat_interval=state.settings.heartbeat_interval,
        lease_wait_max=state.settings.lease_wait_max,
        lease_ahead_max=state.settings.lease_ahead_max,
    )


@router.get("/v1/workers", summary="List workers", tags=["workers"])
async def list_workers(
    request: Request,
    tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader),
    pool: str | None = Query(default=None, min_length=1, max_length=LABEL_MAX),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
) -> WorkerList:
    """The workers by id, deregistered ones included (marked so): what each runs
    (pool, capabilities, tasks, tags), its slots and how many it uses, when it was last
    seen and whether it counts as live for routing. The admin key lists every worker
    (one tenant's with ``Cronwheel-Tenant``); an operator or viewer key the workers
    serving its tenant — its own and the shared ones, never another tenant's."""
    state = api_state(request)
    page = await state.store.workers_list(
        tenant_id, pool=pool, worker_ttl=state.settings.worker_ttl, cursor=cursor, limit=limit
    )
    return WorkerList(items=[_worker_out(w) for w in page.items], next_cursor=page.next_cursor)


def _worker_out(status: WorkerStatus) -> WorkerOut:
    w = status.worker
    return WorkerOut(
        id=w.id,
        name=w.name,
        tenant_id=w.tenant_id,
        pool=w.pool,
        capabilities=w.capabilities,
        tasks=w.tasks,
        tags=w.tags,
        webhooks_only=w.webhooks_only,
        capacity=w.capacity,
        slots_in_use=status.running + status.reserved,
        running=status.running,
        reserved=status.reserved,
        registered_at=w.registered_at,
        last_seen_at=w.last_seen_at,
        live=status.live,
        deregistered=w.deregistered_at is not None,
        deregistered_at=w.deregistered_at,
    )


async def _own_worker(
    state: ApiState, principal: Principal, raw_id: str, *, live: bool = True
) -> Worker:
    """The principal's worker named ``raw_id`` (another tenant's is 404, like an unknown
    one); ``live``: one known here to have deregistered is 410. The cache may not know of
    a deregistration through another API node: the store refuses such a worker's leases
    and starts by itself."""
    worker_id = parse_id(raw_id, "worker")
    worker = state.workers.get(worker_id)
    if worker is None:
        worker = await state.store.workers_get(worker_id)
        state.workers.put(worker_id, worker)
    if not principal.is_admin and worker.tenant_id != principal.tenant_id:
        raise NotFoundError(f"no worker {worker_id}")
    if live and worker.deregistered_at is not None:
        raise WorkerDeregisteredError(
            f"worker {worker_id} was deregistered: it leases and starts nothing any more; "
            "register again for a new worker id"
        )
    return worker


def _leased_out(item: LeasedAttempt, secrets: dict[uuid.UUID, str]) -> LeasedAttemptOut:
    return LeasedAttemptOut(
        attempt_id=item.attempt_id,
        run_id=item.run_id,
        job_id=item.job_id,
        tenant_id=item.tenant_id,
        attempt=item.number,
        task=item.task,
        webhook=item.webhook,
        payload=item.payload,
        fencing_token=item.fencing_token,
        lease_expires_at=item.lease_expires_at,
        deadline=item.deadline,
        due_at=item.due_at,
        heartbeat_timeout=item.heartbeat_timeout,
        progress_timeout=item.progress_timeout,
        signing_secret=None if item.task is not None else secrets.get(item.tenant_id),
        not_before=item.not_before,
    )


async def _signing_secrets(
    state: ApiState, leased: Sequence[LeasedAttempt]
) -> dict[uuid.UUID, str]:
    """The webhook secret of each tenant with a webhook run among ``leased``: one read
    per tenant, however many of its runs the answer holds."""
    tenants = {item.tenant_id for item in leased if item.task is None}
    return {t: await state.store.tenants_webhook_secret(t) for t in sorted(tenants)}


def _record_leased(state: ApiState, leased: Sequence[LeasedAttempt]) -> None:
    for item in leased:
        # Only first tries: a retry's due instant lies before its backoff, which would
        # count the backoff as lateness. A reservation counts when it starts.
        if item.number == 1 and item.not_before is None:
            started_at = item.lease_expires_at - timedelta(seconds=item.heartbeat_timeout)
            observe_start_lateness(due_at=item.due_at, started_at=started_at)


@router.post("/v1/workers/{worker_id}/lease", summary="Lease runs (long-poll)", responses=_GONE)
async def lease(
    worker_id: str,
    body: LeaseRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> LeaseOut:
    """Up to ``max`` runs the worker can execute, highest priority then oldest first.
    When none is ready, waits up to ``wait`` seconds for one and answers as soon as it
    is dispatched; an empty list means none came. A deregistered worker gets 410
    ``worker_deregistered``, also when it is deregistered while its long-poll waits."""
    state = api_state(request)
    if body.wait > state.settings.lease_wait_max:
        raise ValidationError(
            f"wait: at most {state.settings.lease_wait_max:g} seconds", field="wait"
        )
    if body.ahead > state.settings.lease_ahead_max:
        raise ValidationError(
            f"ahead: at most {state.settings.lease_ahead_max:g} seconds", field="ahead"
        )
    worker = await _own_worker(state, principal, worker_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    while True:
        # The ticket is taken before leasing so that a run dispatched in between wakes us.
        ticket = state.notifier.ticket(worker.pool, ahead=body.ahead > 0) if body.wait > 0 else None
        leased = await state.store.attempts_lease(
            worker=worker,
            max=body.max,
            webhooks_only=body.webhooks_only,
            ahead=body.ahead,
            p0_share=state.settings.p0_reserved_share,
        )
        remaining = deadline - loop.time()
        if leased or ticket is None or remaining <= 0 or state.notifier.closed:
            break
        if await request.is_disconnected():
            break
        await state.notifier.wait(ticket, min(state.lease_poll_interval, remaining))
        # A worker that stopped while we waited would never receive what we lease now.
        if await request.is_disconnected():
            break
    if leased and await request.is_disconnected():
        # The answer cannot be delivered: hand the runs back at once rather than leave
        # them RUNNING until their leases expire, each lost try counted.
        await state.store.attempts_release_many(
            items=[HeartbeatItem(a.attempt_id, a.fencing_token) for a in leased],
            tenant_id=worker.tenant_id,
        )
        log.info(
            "lease answer undeliverable: client gone; attempts released",
            extra={"event": "api.lease_undeliverable", "worker_id": str(worker.id)},
        )
        leased = []
    _record_leased(state, leased)
    secrets = await _signing_secrets(state, leased)
    return LeaseOut(
        attempts=[_leased_out(a, secrets) for a in leased], now=await state.notifier.now()
    )


@router.post(
    "/v1/workers/{worker_id}/start",
    summary="Start reservations at their instant",
    response_model=StartOut,
    responses=_GONE,
)
async def start(
    worker_id: str,
    body: StartRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> Response:
    """Starts runs this worker reserved (leased with ``not_before``), named by their
    fencing tokens, in one statement: each whose run is still DISPATCHED under the
    reservation and whose instant has come becomes RUNNING with the attempt id and
    token of its lease, and is the worker's to run from now on. ``not_yet`` tokens are
    due later (try again then); ``refused`` ones are no longer the worker's — the run
    was cancelled or its job paused before it started, or the reservation lapsed and
    another worker took it — and must not run. A deregistered worker gets 410
    ``worker_deregistered`` and starts nothing."""
    state = api_state(request)
    worker = await _own_worker(state, principal, worker_id)
    async with state.starts.serving():
        done = await state.store.attempts_start_many(
            worker_id=worker.id, tokens=body.fencing_tokens, tenant_id=principal.tenant_id
        )
    if done.started_at is not None:
        for due_at in done.first_tries_due:
            observe_start_lateness(due_at=due_at, started_at=done.started_at)
    return _json_response(
        {
            "started_at": _instant(done.started_at),
            "started": done.started,
            "not_yet": done.not_yet,
            "refused": done.refused,
        }
    )


@router.delete(
    "/v1/workers/{worker_id}",
    summary="Deregister a worker",
    response_description="The worker and how many attempts it still held were released",
)
async def deregister_worker(
    worker_id: str, request: Request, principal: Principal = Depends(require_worker)
) -> WorkerDeregistered:
    """The last call of a worker's graceful shutdown. Every attempt the server still
    counts as the worker's is released: its run is ready again at once and the try is
    not counted. That includes runs leased to it that it never received, such as the
    answer to a long-poll cut off as it stopped, which would otherwise stay RUNNING
    until their heartbeat timeout and then count as a failed try. ``released`` is how
    many there were (0 when the worker had reported everything). A tenant's worker key
    reaches only that tenant's workers: another tenant's worker id answers 404.

    From then on the worker id leases and starts nothing: those calls answer 410
    ``worker_deregistered`` (a long-poll waiting at that moment too), on every API
    node. Deregistering again answers 200 with ``released`` 0, so a retried request is
    harmless."""
    state = api_state(request)
    worker = await _own_worker(state, principal, worker_id, live=False)
    # Deregistered first: from its commit on the worker leases nothing, and a lease
    # already under way has committed before it (the store orders the two), so the
    # release below finds everything the worker was ever handed.
    await state.store.workers_deregister(worker.id)
    state.workers.put(worker.id, await state.store.workers_get(worker.id))
    # Its long-polls waiting here lease again at once, and are refused.
    state.notifier.wake([worker.pool])
    # The worker's own tenant scopes the release: every attempt of a tenant's worker is
    # that tenant's, and a worker serving every tenant may hold attempts of any.
    released = await state.store.attempts_release_by_worker(
        worker_id=worker.id, tenant_id=worker.tenant_id
    )
    if released:
        log.info(
            "worker deregistered holding attempts; released",
            extra={
                "event": "api.worker_deregistered",
                "worker_id": str(worker.id),
                "released": len(released),
            },
        )
    return WorkerDeregistered(worker_id=worker.id, released=len(released))


# -- attempts --------------------------------------------------------------------------


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _outcome_json(outcome: AttemptOutcome) -> dict[str, Any]:
    """An :class:`OutcomeOut` as plain JSON, built directly: the batch and start answers
    carry up to a thousand each, and a model per item costs more than the statement."""
    return {
        "attempt_id": str(outcome.attempt_id),
        "ok": outcome.ok,
        "error": None if outcome.ok else (outcome.error_code or "stale_fencing_token"),
        "lease_expires_at": _instant(outcome.lease_expires_at),
        "cancel_requested": outcome.cancel_requested,
        "run_state": None if outcome.run_state is None else str(outcome.run_state),
    }


def _json_response(body: dict[str, Any]) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


async def _apply(
    principal: Principal,
    items: Sequence[Item],
    call: Callable[[Sequence[Item], uuid.UUID | None], Awaitable[list[AttemptOutcome]]],
) -> list[dict[str, Any]]:
    """One store batch over the items, scoped to the principal's tenant by the store
    itself (another tenant's attempts answer ``not_found``). Outcomes keep the order of
    ``items``, as JSON (see :func:`_outcome_json`)."""
    if not items:
        return []
    return [_outcome_json(o) for o in await call(items, principal.tenant_id)]


def _single(outcomes: list[dict[str, Any]]) -> OutcomeOut:
    """The one outcome of a single-item call, or its error."""
    [outcome] = [OutcomeOut.model_validate(o) for o in outcomes]
    if outcome.ok:
        return outcome
    if outcome.error == "not_found":
        raise NotFoundError(f"no attempt {outcome.attempt_id}")
    raise StaleFencingTokenError(
        "stale fencing token: this attempt's lease is no longer yours; nothing was changed",
        field="fencing_token",
    )


def _result_out(outcome: OutcomeOut) -> AttemptResultOut:
    return AttemptResultOut(attempt_id=outcome.attempt_id, ok=True, run_state=outcome.run_state)


@router.post("/v1/attempts/{attempt_id}/heartbeat", summary="Extend a lease", responses=_STALE)
async def heartbeat(
    attempt_id: str,
    body: HeartbeatRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> HeartbeatOut:
    """Extends the lease by the run's heartbeat timeout; ``cancel_requested`` asks the
    worker to stop the run. With ``progress`` (or ``details``) it also reports the
    handler's progress: the attempt keeps the time and the details, and under the job's
    ``progress_timeout`` its progress deadline moves to now plus that timeout."""
    state = api_state(request)
    item = _beat(parse_id(attempt_id, "attempt"), body)
    outcome = _single(
        await _apply(
            principal,
            [item],
            lambda items, tenant: state.store.attempts_heartbeat_many(
                items=items, tenant_id=tenant
            ),
        )
    )
    return HeartbeatOut(
        attempt_id=outcome.attempt_id,
        lease_expires_at=outcome.lease_expires_at,
        cancel_requested=outcome.cancel_requested,
    )


@router.post("/v1/attempts/{attempt_id}/complete", summary="Complete an attempt", responses=_STALE)
async def complete(
    attempt_id: str,
    body: CompleteRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> AttemptResultOut:
    state = api_state(request)
    check_json_size(body.result, limit=state.settings.max_payload_bytes, field="result")
    item = CompleteItem(
        attempt_id=parse_id(attempt_id, "attempt"),
        fencing_token=body.fencing_token,
        result=body.result,
    )
    outcome = _single(
        await _apply(
            principal,
            [item],
            lambda items, tenant: state.store.attempts_complete_many(items=items, tenant_id=tenant),
        )
    )
    return _result_out(outcome)


@router.post("/v1/attempts/{attempt_id}/fail", summary="Fail an attempt", responses=_STALE)
async def fail(
    attempt_id: str,
    body: FailRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> AttemptResultOut:
    """The run is retried after its backoff while attempts remain and ``retryable``;
    otherwise it ends DEAD_LETTER (retries exhausted) or FAILED (not retryable)."""
    state = api_state(request)
    item = FailItem(
        attempt_id=parse_id(attempt_id, "attempt"),
        fencing_token=body.fencing_token,
        error=body.error,
        retryable=body.retryable,
        retry_after=body.retry_after,
    )
    outcome = _single(
        await _apply(
            principal,
            [item],
            lambda items, tenant: state.store.attempts_fail_many(items=items, tenant_id=tenant),
        )
    )
    return _result_out(outcome)


@router.post("/v1/attempts/{attempt_id}/release", summary="Hand an attempt back", responses=_STALE)
async def release(
    attempt_id: str,
    body: FencedRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> AttemptResultOut:
    """For a worker shutting down: the run is ready again at once and the try is not
    counted."""
    state = api_state(request)
    item = HeartbeatItem(
        attempt_id=parse_id(attempt_id, "attempt"), fencing_token=body.fencing_token
    )
    outcome = _single(
        await _apply(
            principal,
            [item],
            lambda items, tenant: state.store.attempts_release_many(items=items, tenant_id=tenant),
        )
    )
    return _result_out(outcome)


def _refs(items: Sequence[AttemptRef]) -> list[HeartbeatItem]:
    return [HeartbeatItem(attempt_id=i.attempt_id, fencing_token=i.fencing_token) for i in items]


def _beat(attempt_id: uuid.UUID, body: HeartbeatRequest | HeartbeatItemIn) -> HeartbeatItem:
    return HeartbeatItem(
        attempt_id=attempt_id,
        fencing_token=body.fencing_token,
        progress=body.reports_progress,
        details=body.details,
    )


@router.post(
    "/v1/attempts/batch",
    summary="Heartbeat, complete, fail and release many",
    response_model=BatchOut,
)
async def batch(
    body: BatchRequest, request: Request, principal: Principal = Depends(require_worker)
) -> Response:
    """One request, one store statement per kind. Each item has its own outcome; a stale
    token fails only its item."""
    state = api_state(request)
    limit = state.settings.max_payload_bytes
    for index, completion in enumerate(body.completions):
        check_json_size(completion.result, limit=limit, field=f"completions.{index}.result")
    if (body.completions or body.failures) and not body.heartbeats:
        await state.starts.wait()  # runs waiting to start go first
    store = state.store
    heartbeats = await _apply(
        principal,
        [_beat(h.attempt_id, h) for h in body.heartbeats],
        lambda items, tenant: store.attempts_heartbeat_many(items=items, tenant_id=tenant),
    )
    completions = await _apply(
        principal,
        [
            CompleteItem(attempt_id=c.attempt_id, fencing_token=c.fencing_token, result=c.result)
            for c in body.completions
        ],
        lambda items, tenant: store.attempts_complete_many(items=items, tenant_id=tenant),
    )
    failures = await _apply(
        principal,
        [
            FailItem(
                attempt_id=f.attempt_id,
                fencing_token=f.fencing_token,
                error=f.error,
                retryable=f.retryable,
                retry_after=f.retry_after,
            )
            for f in body.failures
        ],
        lambda items, tenant: store.attempts_fail_many(items=items, tenant_id=tenant),
    )
    releases = await _apply(
        principal,
        _refs(body.releases),
        lambda items, tenant: store.attempts_release_many(items=items, tenant_id=tenant),
    )
    return _json_response(
        {
            "heartbeats": heartbeats,
            "completions": completions,
            "failures": failures,
            "releases": releases,
        }
    )
