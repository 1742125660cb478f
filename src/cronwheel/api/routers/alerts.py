"""Alerts: what a dashboard shows as needing attention now.

``unroutable_runs``: dispatched runs that wait because no live worker can take them
(their pool, tenant, required capabilities, task and route tags), as the scheduler's
routing check records them; ``quarantined_runs``: runs a scheduler step failed on;
``missed_runs``: runs not dispatched within their job's lateness budget;
``stalled_schedule``: recurring jobs with no run to fire an overdue occurrence
(docs/alerts.md).
Tenant keys see their tenant's alerts; the admin key sees every tenant's, or one
tenant's when it names it with the ``Cronwheel-Tenant`` header.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Request

from cronwheel.api.auth import tenant_or_every_reader
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, AlertList, AlertOut
from cronwheel.api.state import api_state
from cronwheel.domain.model import MissedRun, QuarantinedRun, StalledJob, UnroutableRuns
from cronwheel.store import Store

__all__ = [
    "alert_out",
    "alerts_for",
    "missed_alerts",
    "quarantine_alerts",
    "router",
    "stalled_alerts",
]

router = APIRouter(
    prefix="/v1/alerts", tags=["alerts"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)


def alert_out(group: UnroutableRuns) -> AlertOut:
    noun = "run" if group.runs == 1 else "runs"
    return AlertOut(
        kind="unroutable_runs",
        tenant_id=group.tenant_id,
        pool=group.pool,
        requires=group.requires,
        route_tags=group.route_tags,
        runs=group.runs,
        since=group.since,
        message=f"{group.runs} {noun} waiting: {group.reason}",
    )


@router.get("", summary="List active alerts")
async def list_alerts(
    request: Request, tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader)
) -> AlertList:
    """Active alerts, longest-standing first. ``unroutable_runs``: runs of one tenant,
    pool, set of required capabilities and of route tags that no live worker can take,
    for one reason (e.g. no live worker of the pool handles their task); each such run
    also shows the reason as its ``wait_reason``. ``quarantined_runs``: runs of one job
    that a step of a scheduler pass failed on alone, taken out of it as dead letters (the
    error is each run's ``reason``); the alert clears when they are redriven or the job
    is cancelled. ``missed_runs``: runs of one job still not dispatched past their fire
    time plus the job's ``lateness_budget`` (each has a ``run.missed`` event); clears
    when they are dispatched or cancelled, or the job paused. ``stalled_schedule``: a
    recurring job with no run to fire its next occurrence, that occurrence past the
    budget (``job.schedule_stalled``); clears when it has a run again
    (``job.schedule_resumed``)."""
    return AlertList(items=await alerts_for(api_state(request).store, tenant_id))


async def alerts_for(store: Store, tenant_id: uuid.UUID | None) -> list[AlertOut]:
    """The active alerts of the tenant (None: of every tenant), longest-standing first."""
    unroutable = [alert_out(g) for g in await store.runs_unroutable(tenant_id)]
    quarantined = quarantine_alerts(await store.runs_quarantined(tenant_id))
    missed = missed_alerts(await store.runs_missed(tenant_id))
    stalled = stalled_alerts(await store.jobs_stalled(tenant_id))
    return sorted([*unroutable, *quarantined, *missed, *stalled], key=lambda a: a.since)


def quarantine_alerts(quarantined: list[QuarantinedRun]) -> list[AlertOut]:
    """One alert per job with quarantined runs, its latest error as the message."""
    by_job: dict[uuid.UUID, list[QuarantinedRun]] = {}
    for run in quarantined:
        by_job.setdefault(run.job_id, []).append(run)
    alerts: list[AlertOut] = []
    for job_id, group in by_job.items():
        first, last = group[0], group[-1]
        noun = "run" if len(group) == 1 else "runs"
        alerts.append(
            AlertOut(
                kind="quarantined_runs",
                tenant_id=first.tenant_id,
                pool=first.pool,
                requires=[],
                runs=len(group),
                since=first.quarantined_at,
                message=f"{len(group)} {noun} of job {first.job_name!r} quarantined: {last.reason}",
                job_id=job_id,
                run_ids=[r.run_id for r in group[:100]],
            )
        )
    return alerts


def missed_alerts(missed: list[MissedRun]) -> list[AlertOut]:
    """One alert per job with missed runs, oldest fire time first."""
    by_job: dict[uuid.UUID, list[MissedRun]] = {}
    for run in missed:
        by_job.setdefault(run.job_id, []).append(run)
    alerts: list[AlertOut] = []
    for job_id, group in by_job.items():
        first = group[0]
        noun = "run" if len(group) == 1 else "runs"
        alerts.append(
            AlertOut(
                kind="missed_runs",
                tenant_id=first.tenant_id,
                pool=first.pool,
                requires=[],
                runs=len(group),
                since=first.fire_at,
                message=f"{len(group)} {noun} of job {first.job_name!r} not dispatched "
                "within the job's lateness budget",
                job_id=job_id,
                run_ids=[r.run_id for r in group[:100]],
            )
        )
    return alerts


def stalled_alerts(stalled: list[StalledJob]) -> list[AlertOut]:
    return [
        AlertOut(
            kind="stalled_schedule",
            tenant_id=job.tenant_id,
            pool=job.pool,
            requires=[],
            runs=0,
            since=job.stalled_at,
            message=f"the schedule of job {job.job_name!r} stalled: no run to fire its "
            "next occurrence, past the job's lateness budget (its job.schedule_stalled "
            "event says which)",
            job_id=job.job_id,
        )
        for job in stalled
    ]
