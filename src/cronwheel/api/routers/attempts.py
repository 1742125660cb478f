"""The worker protocol's calls about attempts: heartbeat, complete, fail, release, and
the batch that carries them together (the worker's outbox).

Every call carries the attempt's fencing token; a stale one (the lease was lost and the
run handed to someone else) answers 409 ``stale_fencing_token`` and changes nothing.
Tenant keys only reach their own tenant's attempts: anything else is 404, exactly like
an unknown id.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request, Response

from cronwheel import jsontext
from cronwheel.api.auth import Principal, require_worker
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse
from cronwheel.api.state import api_state
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
    OutcomeOut,
)
from cronwheel.domain.errors import NotFoundError, StaleFencingTokenError
from cronwheel.domain.model import AttemptOutcome
from cronwheel.domain.new_job import check_json_size
from cronwheel.store.values import CompleteItem, FailItem, HeartbeatItem

__all__ = ["instant_text", "json_response", "router"]

router = APIRouter(tags=["worker protocol"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute)

_STALE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "Stale fencing token; nothing changed"}
}

Item = TypeVar("Item", HeartbeatItem, CompleteItem, FailItem)


# -- attempts --------------------------------------------------------------------------


def instant_text(value: datetime | None) -> str | None:
    return None if value is None else jsontext.instant_text(value)


def _outcome_json(outcome: AttemptOutcome) -> dict[str, Any]:
    """An :class:`OutcomeOut` as plain JSON, built directly: the batch and start answers
    carry up to a thousand each, and a model per item costs more than the statement."""
    return {
        "attempt_id": str(outcome.attempt_id),
        "ok": outcome.ok,
        "error": None if outcome.ok else (outcome.error_code or "stale_fencing_token"),
        "lease_expires_at": outcome.lease_expires_at,  # written by orjson, in UTC
        "cancel_requested": outcome.cancel_requested,
        "run_state": None if outcome.run_state is None else str(outcome.run_state),
    }


def json_response(body: dict[str, Any]) -> Response:
    """``body`` as the answer, written by orjson: the worker protocol's answers carry up
    to a thousand items, and a response model per item costs more than the statement.
    Instants may be left as they are (UTC): orjson writes them as ``instant_text``
    does, faster."""
    return Response(jsontext.dumps(body), media_type="application/json")


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
    return json_response(
        {
            "heartbeats": heartbeats,
            "completions": completions,
            "failures": failures,
            "releases": releases,
        }
    )
