"""The worker protocol: register, lease (long-poll), start reservations, the cancels
long-poll, deregister; and the list of workers operators read (the calls about
attempts are in ``attempts.py``).

Every call about an attempt carries its fencing token; a stale one (the lease was lost
and the run handed to someone else) answers 409 ``stale_fencing_token`` and changes
nothing. Tenant keys only reach their own tenant's workers and attempts: anything else
is 404, exactly like an unknown id.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from cronwheel.api.auth import Principal, require_worker, tenant_or_every_reader
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.routers.attempts import instant_text, json_response
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse
from cronwheel.api.state import ApiState, api_state
from cronwheel.api.worker_schemas import (
    CancelOut,
    CancelsOut,
    CancelsRequest,
    GatesOut,
    GatesRequest,
    LeaseOut,
    LeaseRequest,
    StartOut,
    StartRequest,
    WorkerDeregistered,
    WorkerList,
    WorkerOut,
    WorkerRegister,
    WorkerRegistered,
)
from cronwheel.domain.admission import LIMIT_CONCURRENCY
from cronwheel.domain.bounds import LABEL_MAX
from cronwheel.domain.errors import (
    NotFoundError,
    ValidationError,
    WorkerDeregisteredError,
)
from cronwheel.domain.model import LeasedAttempt, Worker, WorkerStatus
from cronwheel.metrics import TENANT_NAMES, observe_start_lateness
from cronwheel.store.values import GatedHeld, HeartbeatItem, LeaseShare

__all__ = ["router"]

router = APIRouter(tags=["worker protocol"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute)
# How often a long-poll held by a tenant's max_concurrent_runs looks again for room.
_HELD_POLL_SECONDS = 0.05
log = logging.getLogger("cronwheel.api")

_GONE: dict[int | str, dict[str, Any]] = {
    410: {
        "model": ErrorResponse,
        "description": "The worker was deregistered (`worker_deregistered`): it gets no "
        "run any more; register again for a new worker id",
    }
}

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
        start_ahead_max=state.settings.start_ahead_max,
        cancels_poll=True,
        gates_poll=state.settings.lease_ahead_max > 0,
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
        slots_in_use=min(w.capacity, status.running + status.reserved),
        running=status.running,
        reserved=status.reserved,
        registered_at=w.registered_at,
        last_seen_at=w.last_seen_at,
        live=status.live,
        deregistered=w.deregistered_at is not None,
        deregistered_at=w.deregistered_at,
    )


def _check_wait(state: ApiState, wait: float) -> None:
    """A long-poll's ``wait`` within the server's ``lease_wait_max`` (422 past it)."""
    if wait > state.settings.lease_wait_max:
        raise ValidationError(
            f"wait: at most {state.settings.lease_wait_max:g} seconds", field="wait"
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


def _leased_json(item: LeasedAttempt, secrets: dict[uuid.UUID, str]) -> dict[str, Any]:
    """A :class:`LeasedAttemptOut` as plain JSON, built directly: a lease answers with up
    to a thousand of them, and a model per item cost more than leasing them."""
    return {
        "attempt_id": str(item.attempt_id),
        "run_id": str(item.run_id),
        "job_id": str(item.job_id),
        "tenant_id": str(item.tenant_id),
        "attempt": item.number,
        "task": item.task,
        "webhook": item.webhook,
        "payload": item.payload,
        "fencing_token": item.fencing_token,
        # Instants as they are: written by orjson (see json_response), in UTC.
        "lease_expires_at": item.lease_expires_at,
        "deadline": item.deadline,
        "due_at": item.due_at,
        "heartbeat_timeout": item.heartbeat_timeout,
        "priority": item.priority,
        "progress_timeout": item.progress_timeout,
        "signing_secret": None if item.task is not None else secrets.get(item.tenant_id),
        "not_before": item.not_before,
        "gated": item.gated,
        "workflow_run_id": None if item.workflow_run_id is None else str(item.workflow_run_id),
    }


async def _signing_secrets(
    state: ApiState, leased: Sequence[LeasedAttempt]
) -> dict[uuid.UUID, str]:
    """The webhook secret of each tenant with a webhook run among ``leased``: one read
    per tenant, however many of its runs the answer holds."""
    tenants = {item.tenant_id for item in leased if item.task is None}
    return {t: await state.store.tenants_webhook_secret(t) for t in sorted(tenants)}


async def _record_leased(state: ApiState, leased: Sequence[LeasedAttempt]) -> None:
    # Only first tries: a retry's due instant lies before its backoff, which would
    # count the backoff as lateness. A reservation (gated or not) counts when it starts.
    first = [i for i in leased if i.number == 1 and i.not_before is None and not i.gated]
    if not first:
        return
    names = await TENANT_NAMES.names({i.tenant_id for i in first}, state.store.tenant_names)
    observe_start_lateness(
        (
            item.due_at,
            item.lease_expires_at - timedelta(seconds=item.heartbeat_timeout),
            names[item.tenant_id],
            item.priority,
        )
        for item in first
    )


@router.post(
    "/v1/workers/{worker_id}/lease",
    summary="Lease runs (long-poll)",
    response_model=LeaseOut,
    responses=_GONE,
)
async def lease(
    worker_id: str,
    body: LeaseRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> Response:
    """Up to ``max`` runs the worker can execute, highest priority then oldest first
    (with ``reserve``, that many more not due yet, as reservations).
    When none is ready, waits up to ``wait`` seconds for one and answers as soon as it
    is dispatched; an empty list means none came. A deregistered worker gets 410
    ``worker_deregistered``, also when it is deregistered while its long-poll waits."""
    state = api_state(request)
    _check_wait(state, body.wait)
    if body.ahead > state.settings.lease_ahead_max:
        raise ValidationError(
            f"ahead: at most {state.settings.lease_ahead_max:g} seconds", field="ahead"
        )
    if body.gated and state.settings.lease_ahead_max <= 0:
        raise ValidationError(
            "gated: this server hands out no reservations (lease_ahead_max is 0)",
            field="gated",
        )
    if body.reserve and not body.ahead:
        raise ValidationError(
            "reserve: reservations beyond max are runs due ahead; set ahead too",
            field="reserve",
        )
    worker = await _own_worker(state, principal, worker_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    share: LeaseShare | None = None  # woken with others: the share of what woke them
    while True:
        # The ticket is taken before leasing so that a run dispatched in between wakes us.
        ticket = state.notifier.ticket(worker.pool, ahead=body.ahead > 0) if body.wait > 0 else None
        if share is not None:
            share.joined()
        try:
            admitted = await state.store.attempts_lease_admitted(
                worker=worker,
                max=body.max,
                webhooks_only=body.webhooks_only,
                ahead=body.ahead,
                p0_share=state.settings.p0_reserved_share,
                reserve=body.reserve,
                share=share,
                gated=body.gated,
            )
        finally:
            # The cohort's last lease to end: what the cohort left (a lease of it went
            # away, or could not take its part) is read again by whoever waits on the
            # pool, now (LeaseShare.ended).
            if share is not None and share.ended():
                state.notifier.wake([worker.pool])
        leased = admitted.attempts
        remaining = deadline - loop.time()
        if leased or ticket is None or remaining <= 0 or state.notifier.closed:
            break
        if await request.is_disconnected():
            break
        # A run held by a dispatch-rate limit is leased when its token comes, not at
        # the next re-poll.
        poll = state.lease_poll_interval
        if admitted.retry_in is not None:
            poll = min(poll, admitted.retry_in + 0.001)
        if LIMIT_CONCURRENCY in admitted.held.values():
            # A run of the tenant's may end on any worker, through any node: look
            # again soon, so a held run goes as soon as one ends.
            poll = min(poll, _HELD_POLL_SECONDS)
        await state.notifier.wait(ticket, min(poll, remaining))
        share = ticket.claim() if ticket.is_set() else None
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
    await _record_leased(state, leased)
    secrets = await _signing_secrets(state, leased)
    return json_response(
        {
            "attempts": [_leased_json(a, secrets) for a in leased],
            "now": instant_text(await state.notifier.now()),
            "p0_reserved_slots": admitted.p0_reserved,
        }
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
    reservation and whose instant is at most ``start_ahead_max`` seconds away becomes
    RUNNING with the attempt id and token of its lease, and is the worker's to run
    from its instant on (from ``started_at``, the earliest such beginning, when its
    instant has passed). ``not_yet`` tokens are due later (try again then);
    ``refused`` ones are no longer the worker's — the run was cancelled or its job
    paused before it started, or the reservation lapsed and another worker took it —
    and must not run. A deregistered worker gets 410
    ``worker_deregistered`` and starts nothing."""
    state = api_state(request)
    worker = await _own_worker(state, principal, worker_id)
    async with state.starts.serving():
        done = await state.store.attempts_start_many(
            worker_id=worker.id,
            tokens=body.fencing_tokens,
            tenant_id=principal.tenant_id,
            ahead=state.settings.start_ahead_max,
        )
    if done.first_tries:
        names = await TENANT_NAMES.names(
            {t for _, _, t, _ in done.first_tries}, state.store.tenant_names
        )
        observe_start_lateness(
            (due_at, began, names[tenant_id], priority)
            for due_at, began, tenant_id, priority in done.first_tries
        )
    return json_response(
        {
            "started_at": instant_text(done.started_at),
            "started": done.started,
            "not_yet": done.not_yet,
            "refused": done.refused,
            "now": instant_text(await state.notifier.now()),
        }
    )


@router.post(
    "/v1/workers/{worker_id}/cancels",
    summary="Hear of cancels of running attempts (long-poll)",
    responses=_GONE,
)
async def cancels(
    worker_id: str,
    body: CancelsRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> CancelsOut:
    """The worker's running attempts whose run was asked to stop (a cancel of the run,
    of its job, in bulk, or ``overlap: cancel_previous``), but those whose fencing token
    is in ``known``: what heartbeats answer as ``cancel_requested``, without waiting for
    the next one. When there is none, waits up to ``wait`` seconds and answers as soon
    as one is asked for, through any API node; an empty list means none came. A
    deregistered worker gets 410 ``worker_deregistered``."""
    state = api_state(request)
    _check_wait(state, body.wait)
    worker = await _own_worker(state, principal, worker_id)
    known = set(body.known)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    while True:
        # The ticket is taken before reading so that a cancel committed in between
        # wakes us.
        ticket = state.cancels.ticket(worker.id) if body.wait > 0 else None
        pending = [
            c
            for c in await state.store.attempts_cancel_requested(
                worker_id=worker.id, tenant_id=worker.tenant_id
            )
            if c.fencing_token not in known
        ]
        remaining = deadline - loop.time()
        if pending or ticket is None or remaining <= 0 or state.cancels.closed:
            break
        if await request.is_disconnected():
            break
        # No re-poll on a timer: a cancel whose notice is lost reaches the worker by
        # its next heartbeat.
        await state.cancels.wait(ticket, remaining)
        # Deregistered through this node meanwhile (which wakes us): 410, as a lease.
        worker = await _own_worker(state, principal, worker_id)
    return CancelsOut(
        cancels=[
            CancelOut(attempt_id=c.attempt_id, run_id=c.run_id, fencing_token=c.fencing_token)
            for c in pending
        ]
    )


@router.post(
    "/v1/workers/{worker_id}/gates",
    summary="Hear of gated reservations whose gate opened (long-poll)",
    response_model=GatesOut,
    responses=_GONE,
)
async def gates(
    worker_id: str,
    body: GatesRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> Response:
    """Of the worker's gated reservations ``fencing_tokens`` (leased with ``gated``):
    those whose gate opened — the node's upstream nodes made it ready — each with the
    payload to run it with, and those that are gone (lapsed, handed back, or the node
    was cancelled or skipped). The worker begins each opened one at once, then starts
    it with ``POST /v1/workers/{id}/start``. When none opened and none is gone, waits
    up to ``wait`` seconds and answers as soon as a gate opens, through any API node.
    A deregistered worker gets 410 ``worker_deregistered``."""
    state = api_state(request)
    _check_wait(state, body.wait)
    worker = await _own_worker(state, principal, worker_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    woken = False
    held: list[GatedHeld] | None = None
    while True:
        # The ticket is taken before reading so that a gate opened in between wakes us.
        ticket = state.gates.ticket(worker.id) if body.wait > 0 else None
        # Woken by a notice: the gates of what was held, alone (the answer's path).
        found = await state.store.attempts_gates(
            worker_id=worker.id,
            tokens=body.fencing_tokens,
            tenant_id=worker.tenant_id,
            held=held if woken else None,
        )
        if woken and not found.opened:  # none of these: read all, gone ones too
            found = await state.store.attempts_gates(
                worker_id=worker.id, tokens=body.fencing_tokens, tenant_id=worker.tenant_id
            )
        held = found.held
        remaining = deadline - loop.time()
        # Woken by a gate of the worker's that is none of these (held since the poll
        # began): answered, so that the worker asks again naming it.
        if found.opened or found.gone or woken or ticket is None or remaining <= 0:
            break
        if state.gates.closed or await request.is_disconnected():
            break
        # Re-polled on a timer too: a lost notice costs a node a moment, not its lapse.
        await state.gates.wait(ticket, min(state.lease_poll_interval, remaining))
        woken = ticket.is_set()
        # Deregistered through this node meanwhile (which wakes us): 410, as a lease.
        worker = await _own_worker(state, principal, worker_id)
    return json_response(
        {
            "opened": [
                {"fencing_tokens": g.fencing_tokens, "payload": g.payload, "opened_at": g.opened_at}
                for g in found.opened
            ],
            "gone": found.gone,
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
    # Its long-polls waiting here lease (or look for cancels) again at once, and are
    # refused.
    state.notifier.wake([worker.pool])
    state.cancels.wake([worker.id])
    state.gates.wake([worker.id])
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
