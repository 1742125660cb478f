"""Jobs: create (idempotently), list, read, cancel."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from cronwheel.api.auth import TenantScope, tenant_reader, tenant_writer
from cronwheel.api.routers.common import api_state, check_json_size, parse_id
from cronwheel.api.schemas import ERROR_RESPONSES, CancelRequest, ErrorResponse, JobList, JobOut
from cronwheel.domain.errors import CronwheelError, InvalidScheduleError, ValidationError
from cronwheel.domain.model import Job, NewJob
from cronwheel.domain.spec import AtSchedule, JobSpec
from cronwheel.domain.states import JobState
from cronwheel.settings import Settings
from cronwheel.timing import first_due

__all__ = ["JobBatch", "job_out", "router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)

_IDEMPOTENCY_KEY_MAX = 200
BATCH_MAX = 1000


def job_out(job: Job, *, first_run_id: Any = None) -> JobOut:
    t = job.template
    return JobOut(
        id=job.id,
        tenant_id=job.tenant_id,
        name=job.name,
        state=str(job.state),
        schedule=job.schedule,
        task=t.get("task"),
        webhook=t.get("webhook"),
        payload=t.get("payload") or {},
        pool=t.get("pool", "default"),
        requires=t.get("requires") or [],
        tags=t.get("tags") or [],
        priority=t.get("priority", 2),
        retry=t.get("retry") or {},
        timeout=t.get("timeout", 0.0),
        heartbeat_timeout=t.get("heartbeat_timeout", 0.0),
        next_due_at=job.next_due_at,
        version=job.version,
        created_at=job.created_at,
        updated_at=job.updated_at,
        idempotency_key=job.idempotency_key,
        first_run_id=first_run_id,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a job",
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
    },
)
async def create_job(
    request: Request,
    response: Response,
    spec: JobSpec = Body(),
    scope: TenantScope = Depends(tenant_writer),
    idempotency_key: str | None = Header(
        default=None,
        alias="Idempotency-Key",
        min_length=1,
        max_length=_IDEMPOTENCY_KEY_MAX,
        description="Makes a retried request return the job the first one created.",
    ),
) -> JobOut:
    """Validates the job, computes when its first run is due (on the database clock) and
    stores both in one transaction."""
    state = api_state(request)
    now = await state.store.db_now()
    new = _new_job(
        state.settings, spec, now, actor=scope.principal.actor, idempotency_key=idempotency_key
    )
    [(job, run, created)] = await state.store.jobs_create_many(scope.tenant_id, jobs=[new])
    if not created:
        response.status_code = status.HTTP_200_OK
    return job_out(job, first_run_id=run.id if run is not None else None)


def _new_job(
    settings: Settings,
    spec: JobSpec,
    now: datetime,
    *,
    actor: str,
    idempotency_key: str | None = None,
) -> NewJob:
    """Validate what the models cannot (payload size, schedule against the clock) and
    resolve the first due instant."""
    check_json_size(spec.payload, limit=settings.max_payload_bytes, field="payload")
    if spec.is_recurring:
        # The scheduler does not yet materialise the next occurrence of a recurring job:
        # accepting one would silently run it once.
        raise InvalidScheduleError(
            "recurring schedules (cron, interval) are not available in this version",
            field="schedule",
        )
    due = first_due(
        spec.schedule,
        now,
        max_horizon=timedelta(days=settings.max_horizon_days),
        past_grace=timedelta(seconds=settings.past_grace_seconds),
    )
    due_local = spec.schedule.at.isoformat() if isinstance(spec.schedule, AtSchedule) else None
    return NewJob(
        spec=spec,
        first_due_at=due,
        idempotency_key=idempotency_key,
        actor=actor,
        due_local=due_local,
    )


class JobBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobSpec] = Field(min_length=1, max_length=BATCH_MAX)


@router.post("/batch", status_code=status.HTTP_201_CREATED, summary="Create many jobs")
async def create_jobs(
    request: Request,
    body: JobBatch,
    scope: TenantScope = Depends(tenant_writer),
) -> JobList:
    """Creates up to 1,000 jobs in one transaction: all of them, or none when any is
    invalid (the error's field names it, e.g. ``jobs.3.schedule.at``). Answers the jobs
    in the order given."""
    state = api_state(request)
    now = await state.store.db_now()
    new: list[NewJob] = []
    for index, spec in enumerate(body.jobs):
        try:
            new.append(_new_job(state.settings, spec, now, actor=scope.principal.actor))
        except CronwheelError as exc:
            exc.field = f"jobs.{index}.{exc.field}" if exc.field else f"jobs.{index}"
            raise
    made = await state.store.jobs_create_many(scope.tenant_id, jobs=new)
    return JobList(
        items=[job_out(job, first_run_id=run.id if run else None) for job, run, _ in made],
        next_cursor=None,
    )


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
    if state is not None and state not in {s.value for s in JobState}:
        raise ValidationError(
            f"state: unknown job state {state!r}; one of " + ", ".join(s.value for s in JobState),
            field="state",
        )
    page = await api_state(request).store.jobs_list(
        scope.tenant_id,
        state=state,
        tag=tag,
        name_prefix=name_prefix,
        cursor=cursor,
        limit=limit,
    )
    return JobList(items=[job_out(j) for j in page.items], next_cursor=page.next_cursor)


@router.get("/{job_id}", summary="Read a job")
async def get_job(
    job_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> JobOut:
    job = await api_state(request).store.jobs_get(scope.tenant_id, parse_id(job_id, "job"))
    return job_out(job)


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
        actor=scope.principal.actor,
        reason=body.reason if body else None,
    )
    return job_out(job)
