"""The runs pages: history filtered by job, state, due time, tag and pool (paged by
cursor); a
run's page — its attempts on a timeline, its events, payload, result or error, and its
log, followed live while the run goes on; the dead letters with their redrive. Every
button goes through the API's own route."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from cronwheel.api.inputs import parse_id
from cronwheel.api.routers import logs as logs_api
from cronwheel.api.routers import runs as runs_api
from cronwheel.api.schemas import DeadLetterRedriveRequest
from cronwheel.api.state import api_state
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Attempt, Run
from cronwheel.domain.states import ACTIVE_STATES, RETRY, RunState
from cronwheel.domain.workflow import WORKFLOW_POOL
from cronwheel.store.values import RunFilter
from cronwheel.ui.charts import Span, timeline
from cronwheel.ui.jobs import PAGE_SIZE
from cronwheel.ui.render import UiRoute, duration, instant, page, redirect, svg
from cronwheel.ui.sessions import Visit, checked_form, signed_in

__all__ = ["attempts_timeline", "router"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

_EVENTS = 200
_LOG_LINES = 500


def _instant_param(value: str, name: str) -> datetime | None:
    """A time filter from the form: ``2026-12-05T10:00`` (UTC) or any ISO instant."""
    if not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValidationError(
            f"{name}: not a date and time (write e.g. 2026-12-05T10:00, read as UTC)",
            field=name,
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _job_param(value: str) -> uuid.UUID | None:
    if not value.strip():
        return None
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        raise ValidationError("job: not a job id", field="job") from None


def _tags_param(value: str) -> list[str]:
    """The tag filter from the form: tags separated by commas, every one of them on the
    run (as ``GET /v1/runs`` takes ``tag`` repeated)."""
    return runs_api.tags_filter([t.strip() for t in value.split(",") if t.strip()])


@router.get("/runs")
async def runs_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    job: str = Query(default="", max_length=100),
    state: str = Query(default="", max_length=20),
    since: str = Query(default="", max_length=40),
    until: str = Query(default="", max_length=40),
    tag: str = Query(default="", max_length=1100),
    pool: str = Query(default="", max_length=100),
    cursor: str = Query(default="", max_length=500),
) -> Response:
    scope = visit.scope
    if state and state not in {s.value for s in RunState}:
        raise ValidationError(f"state: unknown run state {state!r}", field="state")
    start, end = _instant_param(since, "since"), _instant_param(until, "until")
    if start is not None and end is not None and end <= start:
        raise ValidationError("until: must be after 'since'", field="until")
    found = await api_state(request).store.runs_list(
        scope.tenant_id,
        filter=RunFilter(
            job_id=_job_param(job),
            states=[state] if state else None,
            since=start,
            until=end,
            tags=_tags_param(tag),
            pool=pool.strip() or None,
        ),
        cursor=cursor or None,
        limit=PAGE_SIZE,
    )
    return page(
        "runs.html",
        visit,
        title="Runs",
        section="runs",
        runs=found.items,
        next_cursor=found.next_cursor,
        paged=bool(cursor),
        job=job,
        state=state,
        since=since,
        until=until,
        tag=tag,
        pool=pool,
        states=[s.value for s in RunState],
    )


def attempts_timeline(run: Run, attempts: list[Attempt], now: datetime) -> str:
    """The run's attempts as bars from start to end (to now while one runs), with
    marks at the run's due, fire and finish instants."""
    spans = [
        Span(
            label=f"attempt {a.number}",
            start=a.started_at,
            end=a.finished_at or max(now, a.started_at),
            css=f"a-{a.state}",
            tip=f"attempt {a.number}: {a.state}, "
            f"{duration(((a.finished_at or now) - a.started_at).total_seconds())}"
            + (f" — {a.error}" if a.error else ""),
        )
        for a in attempts
    ]
    if run.dispatched_at is not None and (
        not attempts or run.dispatched_at < attempts[0].started_at
    ):
        first = attempts[0].started_at if attempts else (run.finished_at or now)
        spans.insert(
            0,
            Span(
                label="waiting",
                start=min(run.fire_at, run.dispatched_at),
                end=max(first, run.dispatched_at),
                css="wait",
                tip=f"from fire time to the first start: "
                f"{duration((first - run.fire_at).total_seconds())}",
            ),
        )
    marks = [("due", run.due_at), ("fire", run.fire_at)]
    if run.finished_at is not None:
        marks.append(("finished", run.finished_at))
    return timeline(spans, marks, label=f"attempts of run {run.id}")


@router.get("/runs/{run_id}")
async def run_page(
    run_id: str,
    request: Request,
    visit: Visit = Depends(signed_in),
    notice: str = Query(default="", max_length=200),
) -> Response:
    scope = visit.scope
    store = api_state(request).store
    [run] = await runs_api.with_holds(
        store, [await store.runs_get(scope.tenant_id, parse_id(run_id, "run"))]
    )
    if run.pool == WORKFLOW_POOL and run.workflow_run_id is None:
        # A workflow run is its nodes: its own page draws them.
        return RedirectResponse(f"/ui/workflow-runs/{run.id}", status_code=303)
    attempts = await store.attempts_list(scope.tenant_id, run_id=run.id)
    events = await store.events_list(scope.tenant_id, run_id=run.id, limit=_EVENTS)
    lines = await logs_api.log_store(request).read(
        run.tenant_id, run_id=run.id, attempt=None, cursor=None, limit=_LOG_LINES
    )
    now = await store.db_now_estimate()
    return page(
        "run.html",
        visit,
        title=f"Run of {run.job_name}",
        section="runs",
        notice=notice,
        run=run,
        attempts=attempts,
        chart=svg(attempts_timeline(run, attempts, now)) if attempts or run.dispatched_at else "",
        events=events.items,
        more_events=events.next_cursor is not None,
        lines=lines.lines,
        # The script reads on from here: the next page while there is one, else the end.
        log_cursor=lines.next_cursor or lines.end_cursor,
        live=run.state in ACTIVE_STATES,
        dispatch_lateness=None
        if run.dispatched_at is None
        else (run.dispatched_at - run.fire_at).total_seconds(),
        # A retry's fire_at lies after its backoff, past the first start: measured on the
        # first try only, as the overview measures it.
        start_lateness=None
        if run.started_at is None or run.attempt > 1
        else (run.started_at - run.fire_at).total_seconds(),
        may_cancel=run.state in ACTIVE_STATES,
        may_redrive=run.state is RunState.DEAD_LETTER,
        may_retry=run.state in RETRY.sources and run.state is not RunState.DEAD_LETTER,
        now_text=instant(now),
    )


@router.get("/runs/{run_id}/logs.json")
async def run_logs(
    run_id: str,
    request: Request,
    visit: Visit = Depends(signed_in),
    cursor: str = Query(default="", max_length=100),
) -> Response:
    """The log lines after ``cursor`` and the run's state, for the page's script: the
    API's own read (``GET /v1/runs/{id}/logs``) under the session."""
    out = await logs_api.read_logs(
        run_id=run_id,
        request=request,
        scope=visit.scope,
        attempt=None,
        cursor=cursor or None,
        limit=_LOG_LINES,
    )
    body = out.model_dump(mode="json")
    body["live"] = out.run_state in {s.value for s in ACTIVE_STATES}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


_RUN_ACTIONS = {
    "cancel": (runs_api.cancel_run, "Cancelled"),
    "redrive": (runs_api.redrive_run, "Redriven"),
    "retry": (runs_api.retry_run, "Retried"),
}


@router.post("/runs/{run_id}/{action}")
async def run_action(
    run_id: str, action: str, request: Request, visit: Visit = Depends(signed_in)
) -> Response:
    await checked_form(request, visit)
    scope = visit.writer_scope()
    if action not in _RUN_ACTIONS:
        raise ValidationError(f"unknown action {action!r}", field="action")
    route, done = _RUN_ACTIONS[action]
    run = await route(run_id=run_id, request=request, body=None, scope=scope)
    return redirect(f"/ui/runs/{run.id}?notice={done}")


@router.get("/dead-letters")
async def dead_letters_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    cursor: str = Query(default="", max_length=500),
    notice: str = Query(default="", max_length=200),
) -> Response:
    out = await runs_api.list_dead_letters(
        request=request, scope=visit.scope, job_id=None, cursor=cursor or None, limit=PAGE_SIZE
    )
    return page(
        "dead_letters.html",
        visit,
        title="Dead letters",
        section="dead-letters",
        notice=notice,
        runs=out.items,
        next_cursor=out.next_cursor,
        paged=bool(cursor),
    )


@router.post("/dead-letters/redrive")
async def dead_letters_redrive(request: Request, visit: Visit = Depends(signed_in)) -> Response:
    """The ticked dead letters (``run`` fields), or every one (``all``), sent back."""
    form = await checked_form(request, visit)
    scope = visit.writer_scope()
    chosen = form.get("run", [])
    if form.one("all") == "yes":
        body = DeadLetterRedriveRequest(all=True)
    elif chosen:
        try:
            body = DeadLetterRedriveRequest(run_ids=[uuid.UUID(c) for c in chosen])
        except ValueError:
            raise ValidationError("run: not run ids", field="run") from None
    else:
        raise ValidationError("run: tick the dead letters to redrive", field="run")
    await runs_api.redrive_dead_letters(request=request, body=body, scope=scope)
    return redirect("/ui/dead-letters?notice=Redriven")
