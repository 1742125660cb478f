"""Editing a job: ``PATCH /v1/jobs/{id}``, a partial job merged over the job
(``domain/job_edit.py``), optimistic by the job's version — named in ``If-Match``,
answered in ``ETag``. What the edit does to the job's runs is the store's rule
(``store/sql/edits.py``; docs/editing-jobs.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from cronwheel.api.auth import TenantScope, actor_of, tenant_writer
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute, validated
from cronwheel.api.redaction import refuse_redacted
from cronwheel.api.routers.jobs import ETAG_HEADER, job_answer
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse, JobOut, JobPatch
from cronwheel.api.state import api_state
from cronwheel.domain.errors import StaleVersionError, ValidationError
from cronwheel.domain.job_edit import EDITABLE, check_editable, job_edit, patched, spec_json
from cronwheel.domain.model import Job
from cronwheel.domain.spec import JobSpec

__all__ = ["if_match_version", "router"]

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)

# An edit made without If-Match from a version that another change overtook meanwhile
# is made again from the job as it is now, up to this many times.
_TRIES = 5
_VERSION_DIGITS = 18  # any version a job can have, and no integer the database refuses
_SPEC = TypeAdapter(JobSpec)


def if_match_version(value: str | None) -> int | None:
    """The version an ``If-Match`` header names — ``"3"`` (the ``ETag`` as sent) or
    ``3`` — or None for none, or ``*`` (any: the job exists)."""
    if value is None or value.strip() == "*":
        return None
    text = value.strip()
    bare = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text
    if not (bare.isascii() and bare.isdigit() and len(bare) <= _VERSION_DIGITS):
        raise ValidationError(
            f"If-Match: {value[:40]!r} is not a job version: send the ETag of the job "
            '(`"3"`, as GET /v1/jobs/{id} answers it) or the bare version (`3`)',
            field="If-Match",
        )
    return int(bare)


def _reason(body: str | None, query: str | None) -> str | None:
    if body is not None and query is not None and body != query:
        raise ValidationError(
            "reason: given in both the body and the query, differently: give it once",
            field="reason",
        )
    return body if body is not None else query


def _patched_spec(job: Job, patch: dict[str, Any]) -> JobSpec:
    """``job`` with ``patch`` merged over it, validated as a new job is (the same
    errors, the same fields named)."""
    spec, errors = validated(_SPEC, patched(spec_json(job), patch), ("body",))
    if errors:
        raise RequestValidationError(errors, body=patch)
    assert isinstance(spec, JobSpec)
    if "webhook" in patch:
        refuse_redacted(spec)
    return spec


@router.patch(
    "/{job_id}",
    summary="Edit a job",
    response_model=JobOut,
    responses={
        200: {"description": "The job as edited", "headers": ETAG_HEADER},
        409: {
            "model": ErrorResponse,
            "description": "The job is over (`illegal_transition`: cancelled or finished); "
            "or it is one-off and its run was dispatched already (`conflict`)",
        },
        412: {
            "model": ErrorResponse,
            "description": "`If-Match` names a version the job is no longer at "
            "(`precondition_failed`; `details.current_version`, and the `ETag` header, "
            "say which it is): nothing changed",
            "headers": ETAG_HEADER,
        },
    },
)
async def update_job(
    job_id: str,
    request: Request,
    body: JobPatch,
    scope: TenantScope = Depends(tenant_writer),
    if_match: str | None = Header(
        default=None,
        alias="If-Match",
        max_length=100,
        description='the version the edit is made from (`"3"`, the job\'s ETag, or `3`): '
        "the edit applies only while the job is still that version, else 412. Without "
        "it the edit applies to the job as it is",
    ),
    reason: str | None = Query(
        default=None,
        max_length=1000,
        description="why: recorded in the job's history and the audit trail (or `reason` "
        "in the body)",
    ),
) -> Response:
    """Merges the fields given over the job — each replaces the job's whole, `null`
    sets one back to its default — and validates the result as a new job, with the
    same errors (422, or 413 for the payload). The job's pending run follows at once:
    a change of schedule or spread moves it to the new schedule's next occurrence from
    now; a change of its template rewrites it; runs already dispatched or running keep
    what they were dispatched with (docs/editing-jobs.md). A paused job stays paused.
    The version grows by one; the change is recorded (`job.edited`, and `job.edit` in
    the audit trail) with the fields before and after. A patch that changes nothing
    answers the job as it is."""
    state = api_state(request)
    ident = parse_id(job_id, "job")
    patch = body.model_dump(mode="json", exclude_unset=True)
    why = _reason(patch.pop("reason", None), reason)
    if not patch:
        raise ValidationError(
            "the patch names no field of the job to change: give at least one of "
            + ", ".join(EDITABLE)
        )
    wanted = if_match_version(if_match)
    for attempt in range(_TRIES):
        job = await state.store.jobs_get(scope.tenant_id, ident)
        check_editable(job)
        if wanted is not None and wanted != job.version:
            raise StaleVersionError(
                f"job {ident} is at version {job.version}, not {wanted}: read it again "
                "and edit what it is now",
                current_version=job.version,
            )
        spec = _patched_spec(job, patch)
        now = await state.store.db_now_estimate()
        edit = job_edit(job, spec, now=now, limits=state.settings.job_limits)
        if edit.changes_nothing:
            return job_answer(job)
        try:
            edited = await state.store.jobs_update(
                scope.tenant_id,
                ident,
                edit=edit,
                actor=actor_of(request, scope.principal),
                reason=why,
                max_payload_bytes=state.settings.max_payload_bytes,
                now=now,
            )
        except StaleVersionError:
            if wanted is not None or attempt == _TRIES - 1:
                raise
            continue
        return job_answer(edited)
    raise AssertionError("unreachable")
