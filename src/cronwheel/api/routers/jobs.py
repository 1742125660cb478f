"""Jobs: create (idempotently), list, read, preview; cancel, pause, resume, trigger,
backfill; delete."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Annotated, Any, cast

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from cronwheel.api.auth import (
    TenantScope,
    actor_of,
    tenant_reader,
    tenant_writer,
    tenant_writer_of,
)
from cronwheel.api.inputs import (
    FORCE_QUERY,
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENCY_KEY_MAX,
    REASON_QUERY,
    parse_id,
)
from cronwheel.api.jsonbody import MISSING, StrictJsonRoute, solved_by, validated
from cronwheel.api.redaction import redact_webhook, refuse_redacted
from cronwheel.api.routers.logs import delete_logs
from cronwheel.api.routers.runs import run_out
from cronwheel.api.schemas import (
    ADDS_RUNS,
    ERROR_RESPONSES,
    BackfillOut,
    BackfillRequest,
    CancelRequest,
    ErrorResponse,
    JobControlRequest,
    JobDeletedOut,
    JobList,
    JobOut,
    PreviewItem,
    PreviewOut,
    RunOut,
    StoppedRun,
    TriggerRequest,
)
from cronwheel.api.state import api_state
from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import CronwheelError, ValidationError
from cronwheel.domain.model import Job, NewJob, Page
from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
    JobSpec,
    ScheduleSpec,
)
from cronwheel.domain.states import JobState
from cronwheel.timing import due_local, iter_occurrences
from cronwheel.timing.spread import spread_instant

__all__ = [
    "ETAG_HEADER",
    "JobBatch",
    "etag",
    "fields_answer",
    "job_answer",
    "job_fields",
    "job_out",
    "preview_items",
    "router",
    "schedule_of",
]

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)

_JSON = "application/json"
BATCH_MAX = 1000
PREVIEW_MAX = 1000

_SCHEDULE_MODELS: dict[str, type[BaseModel]] = {
    "at": AtSchedule,
    "delay": DelaySchedule,
    "asap": AsapSchedule,
    "cron": CronSchedule,
    "interval": IntervalSchedule,
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "Not allowed in the job's state"}
}


def job_fields(job: Job, *, first_run_id: uuid.UUID | None = None) -> dict[str, Any]:
    """The job as :class:`JobOut` answers it, field for field, in values orjson writes as
    the model would (instants in UTC with ``Z``): no model built and validated per job,
    which was most of a 1,000-job batch's answer."""
    t = job.template
    return {
        "id": job.id,
        "tenant_id": job.tenant_id,
        "name": job.name,
        "state": str(job.state),
        "schedule": job.schedule,
        "task": t.task,
        "webhook": redact_webhook(t.webhook),
        "payload": t.payload,
        "pool": t.pool,
        "requires": t.requires,
        "tags": t.tags,
        "route_tags": t.route_tags,
        "priority": t.priority,
        "retry": t.retry,
        "timeout": float(t.timeout),
        "heartbeat_timeout": float(t.heartbeat_timeout),
        "progress_timeout": None if t.progress_timeout is None else float(t.progress_timeout),
        "spread": float(t.spread),
        "lateness_budget": float(t.lateness_budget),
        "next_due_at": None if job.next_due_at is None else job.next_due_at.astimezone(UTC),
        "version": job.version,
        "created_at": job.created_at.astimezone(UTC),
        "updated_at": job.updated_at.astimezone(UTC),
        "idempotency_key": job.idempotency_key,
        "first_run_id": first_run_id,
    }


def fields_answer(body: Any, model: type[BaseModel], status_code: int) -> Response:
    """``body`` (of :func:`job_fields`) as JSON; through ``model`` only when orjson cannot
    write a value (an integer past 64 bits in a payload)."""
    try:
        content = orjson.dumps(body, default=_uuid_text, option=orjson.OPT_UTC_Z)
    except orjson.JSONEncodeError:
        content = model.model_validate(body).model_dump_json().encode()
    return Response(content, status_code=status_code, media_type=_JSON)


def _uuid_text(value: Any) -> str:
    # asyncpg's own UUID type (a tenant id read from the database), which orjson does
    # not know; anything else goes through the model.
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(type(value).__name__)


def job_out(job: Job, *, first_run_id: Any = None) -> JobOut:
    return JobOut.model_validate(job_fields(job, first_run_id=first_run_id))


ETAG_HEADER: dict[str, Any] = {
    "ETag": {
        "description": 'the job\'s version, quoted (`"3"`): send it in `If-Match` to edit '
        "the job only while it is still this version (`PATCH /v1/jobs/{id}`)",
        "schema": {"type": "string"},
    }
}


def etag(version: int) -> str:
    """The ``ETag`` of a job at ``version``: the version, quoted."""
    return f'"{version}"'


def job_answer(job: Job, status_code: int = status.HTTP_200_OK) -> Response:
    """The job as :class:`JobOut`, its version as ``ETag``."""
    answer = fields_answer(job_fields(job), JobOut, status_code)
    answer.headers["ETag"] = etag(job.version)
    return answer


# The two creation routes solve their parameters by hand (``solved_by``), exactly as
# their signatures declare them.
_SPEC = TypeAdapter(JobSpec)
_IDEMPOTENCY_KEY = TypeAdapter(Annotated[str, Field(min_length=1, max_length=IDEMPOTENCY_KEY_MAX)])


async def _create_job_arguments(request: Request, body: Any) -> dict[str, Any]:
    scope = await tenant_writer_of(request)
    raw_key = request.headers.get("idempotency-key", MISSING)
    key, errors = validated(
        _IDEMPOTENCY_KEY, raw_key, ("header", "Idempotency-Key"), required=False
    )
    spec, body_errors = validated(_SPEC, body, ("body",))
    if errors or body_errors:
        raise RequestValidationError(errors + body_errors, body=body)
    return {"spec": spec, "scope": scope, "idempotency_key": key}


async def _create_jobs_arguments(request: Request, body: Any) -> dict[str, Any]:
    scope = await tenant_writer_of(request)
    batch, errors = validated(_BATCH, body, ("body",))
    if errors:
        raise RequestValidationError(errors, body=body)
    return {"body": batch, "scope": scope}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a job",
    response_model=JobOut,
    responses={
        200: {
            "model": JobOut,
            "description": "The Idempotency-Key was used before with "
            "the same request: the job created then",
        },
        409: {
            "model": ErrorResponse,
            "description": "The Idempotency-Key was used before "
            "with a different request (`idempotency_conflict`)",
        },
        **ADDS_RUNS,
    },
)
@solved_by(_create_job_arguments)
async def create_job(
    request: Request,
    spec: JobSpec = Body(),
    scope: TenantScope = Depends(tenant_writer),
    idempotency_key: str | None = IDEMPOTENCY_KEY_HEADER,
) -> Response:
    """Validates the job, computes when its first run is due (on the database clock) and
    stores both in one transaction."""
    state = api_state(request)
    # The database clock as this process tracks it: no round trip of its own.
    now = await state.store.db_now_estimate()
    new = _new_job(
        state.settings.job_limits,
        spec,
        now,
        actor=actor_of(request, scope.principal),
        idempotency_key=idempotency_key,
    )
    job, run, created = await state.creates.create(scope.tenant_id, new, now=now)
    return fields_answer(
        job_fields(job, first_run_id=run.id if run is not None else None),
        JobOut,
        status.HTTP_201_CREATED if created else status.HTTP_200_OK,
    )


def _new_job(
    limits: JobLimits,
    spec: JobSpec,
    now: datetime,
    *,
    actor: Actor,
    idempotency_key: str | None = None,
) -> NewJob:
    refuse_redacted(spec)
    return new_job(spec, now=now, limits=limits, actor=actor, idempotency_key=idempotency_key)


def _new_jobs(
    specs: Sequence[JobSpec], limits: JobLimits, now: datetime, *, actor: Actor
) -> Iterator[NewJob]:
    """The batch's jobs one by one; the error of one names its place (``jobs.3.…``)."""
    for index, spec in enumerate(specs):
        try:
            yield _new_job(limits, spec, now, actor=actor)
        except CronwheelError as exc:
            exc.field = f"jobs.{index}.{exc.field}" if exc.field else f"jobs.{index}"
            raise


class JobBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobSpec] = Field(min_length=1, max_length=BATCH_MAX)


_BATCH = TypeAdapter(JobBatch)


@router.post(
    "/batch",
    status_code=status.HTTP_201_CREATED,
    summary="Create many jobs",
    response_model=JobList,
    responses=ADDS_RUNS,
)
@solved_by(_create_jobs_arguments)
async def create_jobs(
    request: Request,
    body: JobBatch,
    scope: TenantScope = Depends(tenant_writer),
) -> Response:
    """Creates up to 1,000 jobs in one transaction: all of them, or none when any is
    invalid (the error's field names it, e.g. ``jobs.3.schedule.at``) or their runs
    would take the tenant past its ``max_pending_runs`` (429 ``limit_exceeded``).
    Answers the jobs in the order given."""
    state = api_state(request)
    now = await state.store.db_now_estimate()
    new = list(
        _new_jobs(
            body.jobs, state.settings.job_limits, now, actor=actor_of(request, scope.principal)
        )
    )
    made = await state.store.jobs_create_many_brief(scope.tenant_id, jobs=new, now=now)
    items = [job_fields(job, first_run_id=run_id) for job, run_id, _ in made]
    return fields_answer({"items": items, "next_cursor": None}, JobList, status.HTTP_201_CREATED)


@router.get("", summary="List jobs")
async def list_jobs(
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    state: str | None = Query(default=None, description="active | paused | cancelled | finished"),
    tag: str | None = Query(default=None, max_length=100),
    name_prefix: str | None = Query(default=None, max_length=200),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
) -> JobList:
    """Newest first; pass ``next_cursor`` as ``cursor`` for the next page."""
    page = await jobs_page(
        request,
        scope,
        state=state,
        tag=tag,
        name_prefix=name_prefix,
        cursor=cursor,
        limit=limit,
        workflows=False,  # GET /v1/workflows lists those
    )
    return JobList(items=[job_out(j) for j in page.items], next_cursor=page.next_cursor)


async def jobs_page(
    request: Request,
    scope: TenantScope,
    *,
    state: str | None,
    tag: str | None,
    name_prefix: str | None,
    cursor: str | None,
    limit: int,
    workflows: bool,
) -> Page[Job]:
    """A page of the tenant's jobs, or of its workflows; a state filter must name a job
    state (422 otherwise)."""
    if state is not None and state not in {s.value for s in JobState}:
        raise ValidationError(
            f"state: unknown job state {state!r}; one of " + ", ".join(s.value for s in JobState),
            field="state",
        )
    return await api_state(request).store.jobs_list(
        scope.tenant_id,
        state=state,
        tag=tag,
        name_prefix=name_prefix,
        cursor=cursor,
        limit=limit,
        workflows=workflows,
    )


@router.get(
    "/{job_id}",
    summary="Read a job",
    response_model=JobOut,
    responses={200: {"description": "The job", "headers": ETAG_HEADER}},
)
async def get_job(
    job_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> Response:
    """The job; its version is the `ETag` (`If-Match` of an edit)."""
    job = await api_state(request).store.jobs_get(scope.tenant_id, parse_id(job_id, "job"))
    return job_answer(job)


@router.post(
    "/{job_id}/cancel",
    summary="Cancel a job",
    responses={409: {"model": ErrorResponse, "description": "The job is already over"}},
)
async def cancel_job(
    job_id: str,
    request: Request,
    body: CancelRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> JobOut:
    """The job fires no more; its pending runs are cancelled and its running ones are
    asked to stop (cooperatively, on their next heartbeat)."""
    job = await api_state(request).store.jobs_cancel(
        scope.tenant_id,
        parse_id(job_id, "job"),
        actor=actor_of(request, scope.principal),
        reason=body.reason if body else None,
    )
    return job_out(job)


@router.delete(
    "/{job_id}",
    summary="Delete a job",
    responses={
        409: {
            "model": ErrorResponse,
            "description": "A run of the job is in progress (`in_use`; the error names the "
            "runs): cancel the job and let them finish, or pass force=true",
        }
    },
)
async def delete_job(
    job_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_writer),
    force: bool = FORCE_QUERY,
    reason: str | None = REASON_QUERY,
) -> JobDeletedOut:
    """Deletes the job, in whatever state, with its runs, their attempts, events and
    worker logs. Refused (409 `in_use`) while a run of it is DISPATCHED or RUNNING,
    unless `force=true`: those runs end with the job, and a worker still running one
    gets 409 `stale_fencing_token` for whatever it reports next. Cancelling a job does
    not delete it: its history stays readable until it is deleted. The deletion itself
    is recorded (event `job.deleted`: who, when, why, the job's name) and outlives the
    job, with the job's other events not tied to a run."""
    state = api_state(request)
    deleted = await state.store.jobs_delete(
        scope.tenant_id,
        parse_id(job_id, "job"),
        force=force,
        actor=actor_of(request, scope.principal),
        reason=reason,
    )
    await delete_logs(request, scope.tenant_id, deleted.attempted)
    return JobDeletedOut(
        id=deleted.id,
        name=deleted.name,
        deleted_at=deleted.at,
        runs_deleted=deleted.runs,
        runs_stopped=[StoppedRun(id=i, state=s) for i, s in deleted.stopped],
    )


@router.post(
    "/{job_id}/pause",
    summary="Pause a job",
    responses=_CONFLICT,
)
async def pause_job(
    job_id: str,
    request: Request,
    body: JobControlRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> JobOut:
    """An active job fires nothing until resumed: its pending runs are held (their due
    instants kept), runs already handed to the dispatcher are taken back, running ones
    finish. 409 unless the job is active."""
    job = await api_state(request).store.jobs_pause(
        scope.tenant_id,
        parse_id(job_id, "job"),
        actor=actor_of(request, scope.principal),
        reason=body.reason if body else None,
    )
    return job_out(job)


@router.post(
    "/{job_id}/resume",
    summary="Resume a paused job",
    responses=_CONFLICT,
)
async def resume_job(
    job_id: str,
    request: Request,
    body: JobControlRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> JobOut:
    """The held runs are due again at their due instants: those missed while paused
    fire at once, and the job's catch-up policy decides what becomes of them. 409
    unless the job is paused."""
    job = await api_state(request).store.jobs_resume(
        scope.tenant_id,
        parse_id(job_id, "job"),
        actor=actor_of(request, scope.principal),
        reason=body.reason if body else None,
    )
    return job_out(job)


@router.post(
    "/{job_id}/trigger",
    status_code=status.HTTP_201_CREATED,
    summary="Run a job now",
    responses={**_CONFLICT, **ADDS_RUNS},
)
async def trigger_job(
    job_id: str,
    request: Request,
    body: TriggerRequest | None = Body(default=None),
    scope: TenantScope = Depends(tenant_writer),
) -> RunOut:
    """A run due now, outside the schedule (origin `trigger`), with `payload` merged
    over the job's. Allowed for active, paused (the run is not held) and finished jobs;
    409 for a cancelled one."""
    state = api_state(request)
    ident = parse_id(job_id, "job")
    run = await state.store.jobs_trigger(
        scope.tenant_id,
        ident,
        actor=actor_of(request, scope.principal),
        payload=body.payload if body else None,
        max_payload_bytes=state.settings.max_payload_bytes,
    )
    return run_out(run)


@router.post(
    "/{job_id}/backfill",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Backfill a past range",
    responses={**_CONFLICT, **ADDS_RUNS},
)
async def backfill_job(
    job_id: str,
    request: Request,
    body: BackfillRequest,
    scope: TenantScope = Depends(tenant_writer),
) -> BackfillOut:
    """Runs (origin `backfill`) for the occurrences of a cron or interval job in
    `[from, to)`, which must lie in the past. Idempotent: an occurrence that already
    has a run gets no second one, so repeating a backfill creates nothing. Throttled:
    the runs are released `rate` per second from now."""
    runs = await api_state(request).store.jobs_backfill(
        scope.tenant_id,
        parse_id(job_id, "job"),
        start=body.start,
        end=body.end,
        rate=body.rate,
        actor=actor_of(request, scope.principal),
    )
    return BackfillOut(created=len(runs), runs=[r.id for r in runs])


@router.get("/{job_id}/preview", summary="Preview a job's next due instants")
async def preview_job(
    job_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    count: int = Query(default=10, ge=1, le=PREVIEW_MAX, description="how many occurrences"),
) -> PreviewOut:
    """The next `count` occurrences from now, UTC and local with their offsets, as the
    schedule's DST policies make them (a wall time skipped by a spring-forward gap under
    `on_nonexistent: skip` is listed with kind `skipped`). A one-off job lists its one
    pending due instant; a cancelled or finished job lists nothing."""
    state = api_state(request)
    job = await state.store.jobs_get(scope.tenant_id, parse_id(job_id, "job"))
    now = await state.store.db_now()
    return PreviewOut(items=preview_items(job, now, count))


def schedule_of(job: Job) -> ScheduleSpec:
    """The job's stored schedule as its spec model."""
    return cast(ScheduleSpec, _SCHEDULE_MODELS[job.kind].model_validate(job.schedule))


def preview_items(job: Job, now: datetime, count: int) -> list[PreviewItem]:
    if job.state not in (JobState.ACTIVE, JobState.PAUSED):
        return []
    schedule = schedule_of(job)
    spread = job.template.spread
    if isinstance(schedule, CronSchedule | IntervalSchedule):
        found = islice(iter_occurrences(schedule, now, include_skipped=True), count)
        return [
            PreviewItem(
                due_at=o.utc,
                # A skipped wall time never runs: nothing fires for it.
                fire_at=o.utc if o.kind == "skipped" else spread_instant(job.id, o.utc, spread),
                due_local=o.local,
                kind=o.kind,
                reason=o.reason,
            )
            for o in found
        ]
    if job.next_due_at is None:
        return []
    due = job.next_due_at
    local = due_local(schedule, due) or due.isoformat()
    fire_at = spread_instant(job.id, due, spread)
    return [PreviewItem(due_at=due, fire_at=fire_at, due_local=local, kind="normal")]
