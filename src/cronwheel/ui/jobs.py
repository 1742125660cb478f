"""The jobs pages: the list (filtered by name and state, paged by cursor; each job's
schedule in words and cron, its next due instant in UTC and in its zone, its last
outcome) and a job's page — its schedule in words, its next due instants, its latest
runs — with the
buttons that pause, resume, trigger and cancel it through the API's own routes (the
same checks, the same history and audit trail)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from cronwheel.api.inputs import parse_id
from cronwheel.api.routers import jobs as jobs_api
from cronwheel.api.schemas import JobOut
from cronwheel.api.state import api_state
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Job, Run
from cronwheel.domain.states import TERMINAL_STATES, JobState, RunState
from cronwheel.store.values import RunFilter
from cronwheel.timing import due_local
from cronwheel.ui.render import UiRoute, page, redirect
from cronwheel.ui.sessions import Visit, checked_form, signed_in
from cronwheel.ui.words import schedule_in_words

__all__ = ["PAGE_SIZE", "last_outcome", "router"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

PAGE_SIZE = 50
_RECENT_RUNS = 10
_NEXT_DUE = 5

# What each button does, and the route of the API that does it.
_ACTIONS: dict[str, tuple[Callable[..., Awaitable[JobOut]], str]] = {
    "pause": (jobs_api.pause_job, "Paused"),
    "resume": (jobs_api.resume_job, "Resumed"),
    "cancel": (jobs_api.cancel_job, "Cancelled"),
}


@router.get("/jobs")
async def jobs_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    name: str = Query(default="", max_length=200),
    state: str = Query(default="", max_length=20),
    cursor: str = Query(default="", max_length=500),
) -> Response:
    scope = visit.scope
    if state and state not in {s.value for s in JobState}:
        raise ValidationError(f"state: unknown job state {state!r}", field="state")
    found = await api_state(request).store.jobs_list(
        scope.tenant_id,
        state=state or None,
        name_prefix=name.strip() or None,
        cursor=cursor or None,
        limit=PAGE_SIZE,
        workflows=False,  # on their own page
    )
    # Every listed job's last outcome in one read, never one per job.
    last = await api_state(request).store.runs_last_finished(
        scope.tenant_id, job_ids=[j.id for j in found.items]
    )
    return page(
        "jobs.html",
        visit,
        title="Jobs",
        section="jobs",
        jobs=[
            {
                "job": j,
                "words": schedule_in_words(j.schedule),
                "local": _due_local(j),
                "last": last.get(j.id),
            }
            for j in found.items
        ],
        next_cursor=found.next_cursor,
        paged=bool(cursor),
        name=name,
        state=state,
        states=[s.value for s in JobState],
    )


def _due_local(job: Job) -> str | None:
    """The job's next due instant on the wall clock of its zone, with the offset (as
    the job's page shows its next ones); UTC where no zone applies (an interval)."""
    if job.next_due_at is None:
        return None
    return due_local(jobs_api.schedule_of(job), job.next_due_at) or job.next_due_at.isoformat()


async def last_outcome(request: Request, job: Job, recent: list[Run]) -> Run | None:
    """The job's latest finished run: among its latest runs, else the newest of its
    finished ones (the list's read, for one job)."""
    for run in recent:
        if run.state in TERMINAL_STATES:
            return run
    found = await api_state(request).store.runs_last_finished(job.tenant_id, job_ids=[job.id])
    return found.get(job.id)


def _next_due(job: Job, now: datetime) -> list[dict[str, Any]]:
    return [
        {"utc": item.due_at, "local": item.due_local, "kind": item.kind, "reason": item.reason}
        for item in jobs_api.preview_items(job, now, _NEXT_DUE)
    ]


@router.get("/jobs/{job_id}")
async def job_page(
    job_id: str,
    request: Request,
    visit: Visit = Depends(signed_in),
    notice: str = Query(default="", max_length=200),
) -> Response:
    scope = visit.scope
    store = api_state(request).store
    job = await store.jobs_get(scope.tenant_id, parse_id(job_id, "job"))
    recent = await store.runs_list(
        scope.tenant_id, filter=RunFilter(job_id=job.id), limit=_RECENT_RUNS
    )
    now = await store.db_now_estimate()
    return page(
        "job.html",
        visit,
        title=job.name,
        section="jobs",
        notice=notice,
        job=job,
        words=schedule_in_words(job.schedule),
        zone=job.schedule.get("timezone", "UTC"),
        next_due=_next_due(job, now),
        recent=recent.items,
        more_runs=recent.next_cursor is not None,
        last=await last_outcome(request, job, recent.items),
        may_pause=job.state is JobState.ACTIVE,
        may_resume=job.state is JobState.PAUSED,
        may_trigger=job.state is not JobState.CANCELLED,
        may_cancel=job.state in (JobState.ACTIVE, JobState.PAUSED),
        running_states={RunState.RUNNING, RunState.DISPATCHED, RunState.SCHEDULED},
    )


@router.post("/jobs/{job_id}/{action}")
async def job_action(
    job_id: str, action: str, request: Request, visit: Visit = Depends(signed_in)
) -> Response:
    """A button of the job's page: the API's own route does the work."""
    await checked_form(request, visit)
    scope = visit.writer_scope()
    if action == "trigger":
        run = await jobs_api.trigger_job(job_id=job_id, request=request, body=None, scope=scope)
        return redirect(f"/ui/runs/{run.id}?notice=Triggered")
    if action not in _ACTIONS:
        raise ValidationError(f"unknown action {action!r}", field="action")
    route, done = _ACTIONS[action]
    job = await route(job_id=job_id, request=request, body=None, scope=scope)
    return redirect(f"/ui/jobs/{job.id}?notice={done}")
