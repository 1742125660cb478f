"""The overview: what a dashboard's first page and ``cronwheel top`` show, in one read.

::

    GET /v1/overview?minutes=60
      minutes[]   the runs due in each minute of the window: by state now, and
                  their dispatch and start lateness p50/p99   (store.runs_overview)
      total       the same over the whole window, and its success rate
      alerts      as GET /v1/alerts                            (alerts.alerts_for)
      pools       as GET /v1/pools: workers, free slots, runs waiting
                                                               (store.pools_status)

The window is the last ``minutes`` minutes of the database clock, the current minute
included so far: from the start of the minute ``minutes - 1`` before the current one
up to now. Tenant keys see their tenant's; the admin key every tenant's, or one
tenant's with the ``Cronwheel-Tenant`` header.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field

from cronwheel.api.auth import tenant_or_every_reader
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.pool_schemas import PoolOut, pool_out
from cronwheel.api.routers.alerts import alerts_for
from cronwheel.api.schemas import ERROR_RESPONSES, AlertOut, ResponseModel, UtcInstant
from cronwheel.api.state import api_state
from cronwheel.domain.states import RunState
from cronwheel.store import Store
from cronwheel.store.sql.overview import OVERVIEW_MINUTES_MAX
from cronwheel.store.values import RunStats

__all__ = [
    "OverviewMinute",
    "OverviewOut",
    "OverviewTotal",
    "get_overview",
    "overview_for",
    "router",
    "success_rate",
]

router = APIRouter(
    prefix="/v1/overview", tags=["overview"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)

# The outcomes of running: the share of SUCCESS among them is the success rate.
_OUTCOMES = (RunState.SUCCESS, RunState.FAILED, RunState.DEAD_LETTER)


class OverviewMinute(ResponseModel):
    at: UtcInstant = Field(description="the minute's beginning")
    states: dict[str, int] = Field(
        description="the runs due in the minute, by their state now (every state, zeros "
        "included): SUCCESS, FAILED, DEAD_LETTER, CANCELLED and SKIPPED have finished"
    )
    dispatch_lateness_p50_ms: float | None = Field(
        description="median of dispatched_at - fire_at of those runs dispatched (null: none)"
    )
    dispatch_lateness_p99_ms: float | None = Field(description="its 99th percentile")
    start_lateness_p50_ms: float | None = Field(
        description="median of started_at - fire_at of those runs started on their first "
        "try (null: none)"
    )
    start_lateness_p99_ms: float | None = Field(description="its 99th percentile")


class OverviewTotal(OverviewMinute):
    at: UtcInstant = Field(description="the window's beginning")
    runs: int = Field(description="the runs due in the window")
    success_rate: float | None = Field(
        description="SUCCESS / (SUCCESS + FAILED + DEAD_LETTER) of the runs due in the "
        "window (null: none of them has finished so)"
    )


class OverviewOut(ResponseModel):
    now: UtcInstant = Field(description="the database clock when read")
    since: UtcInstant = Field(description="the window's beginning (a whole minute)")
    minutes: list[OverviewMinute] = Field(description="every minute of the window, oldest first")
    total: OverviewTotal
    alerts: list[AlertOut] = Field(description="as `GET /v1/alerts` answers")
    pools: list[PoolOut] = Field(
        description="as `GET /v1/pools` answers: live workers, free slots (admin only) "
        "and the runs waiting (ready: dispatched, not started; due: not dispatched yet)"
    )


def success_rate(states: dict[str, int]) -> float | None:
    outcomes = sum(states.get(s.value, 0) for s in _OUTCOMES)
    return None if outcomes == 0 else states.get(RunState.SUCCESS.value, 0) / outcomes


def _minute(stats: RunStats) -> OverviewMinute:
    return OverviewMinute(**_fields(stats))


def _fields(stats: RunStats) -> dict[str, object]:
    return {
        "at": stats.at,
        "states": stats.states,
        "dispatch_lateness_p50_ms": stats.dispatch_p50_ms,
        "dispatch_lateness_p99_ms": stats.dispatch_p99_ms,
        "start_lateness_p50_ms": stats.start_p50_ms,
        "start_lateness_p99_ms": stats.start_p99_ms,
    }


async def overview_for(
    store: Store,
    tenant_id: uuid.UUID | None,
    *,
    minutes: int,
    now: datetime,
    default_share: float = 0.0,
    worker_ttl: float = 30.0,
) -> OverviewOut:
    """The overview of the tenant's runs (None: every tenant's) due in the ``minutes``
    minutes up to ``now``, with the alerts and pools as their own routes answer them
    (``default_share`` and ``worker_ttl``: the server's settings, as ``/v1/pools``
    uses them)."""
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    window = await store.runs_overview(tenant_id, since=since, minutes=minutes, until=now)
    statuses = await store.pools_status(
        tenant_id, default_share=default_share, worker_ttl=worker_ttl, now=now
    )
    total = window.total
    return OverviewOut(
        now=now,
        since=since,
        minutes=[_minute(m) for m in window.minutes],
        total=OverviewTotal(
            **_fields(total),
            runs=sum(total.states.values()),
            success_rate=success_rate(total.states),
        ),
        alerts=await alerts_for(store, tenant_id),
        pools=[pool_out(s) for s in statuses],
    )


@router.get("", summary="The overview of the last minutes' runs, alerts and pools")
async def get_overview(
    request: Request,
    minutes: int = Query(
        default=60,
        ge=1,
        le=OVERVIEW_MINUTES_MAX,
        description="the window: this many minutes up to now, the current one included",
    ),
    tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader),
) -> OverviewOut:
    """The runs due in each minute of the window, by their state now, with the median
    and 99th percentile of their dispatch and start lateness; the same over the window
    with its success rate; the active alerts (as `GET /v1/alerts`); and the pools (as
    `GET /v1/pools`). Reads only the window's runs. The admin key sees every tenant's
    (one tenant's with `Cronwheel-Tenant`); an operator or viewer key its own."""
    state = api_state(request)
    return await overview_for(
        state.store,
        tenant_id,
        minutes=minutes,
        now=await state.store.db_now(),
        default_share=state.settings.p0_reserved_share,
        worker_ttl=state.settings.worker_ttl,
    )
