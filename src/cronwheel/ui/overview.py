"""The overview page: the last hour minute by minute — runs by state, the success rate,
dispatch and start lateness (p50, p99) — with the alerts and each pool's workers and
free capacity."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from cronwheel.api.overview import OverviewOut, overview_for, success_rate
from cronwheel.api.state import api_state
from cronwheel.domain.states import RunState
from cronwheel.ui.charts import Series, line_chart, stacked_bars
from cronwheel.ui.render import UiRoute, page, svg
from cronwheel.ui.sessions import Visit, signed_in

__all__ = ["MINUTES", "STACKED", "Minutes", "minutes_of", "router"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

MINUTES = 60
# The states in the order the bars stack them, bottom up.
STACKED = [s.value for s in (
    RunState.SUCCESS, RunState.FAILED, RunState.DEAD_LETTER, RunState.CANCELLED,
    RunState.SKIPPED, RunState.RUNNING, RunState.DISPATCHED, RunState.SCHEDULED,
)]  # fmt: skip


@dataclass
class Minutes:
    """The overview's numbers, one per minute, oldest first."""

    times: list[datetime]
    by_state: dict[str, list[int]]
    success_rate: list[float | None]  # percent of the runs finished that minute
    dispatch_p50: list[float | None]  # milliseconds
    dispatch_p99: list[float | None]
    start_p50: list[float | None]
    start_p99: list[float | None]
    totals: dict[str, int] = field(default_factory=dict)


def minutes_of(overview: OverviewOut) -> Minutes:
    """The page's per-minute series from the overview ``GET /v1/overview`` answers."""
    rates = [success_rate(m.states) for m in overview.minutes]
    return Minutes(
        times=[m.at for m in overview.minutes],
        by_state={s: [m.states.get(s, 0) for m in overview.minutes] for s in STACKED},
        success_rate=[None if r is None else 100 * r for r in rates],
        dispatch_p50=[m.dispatch_lateness_p50_ms for m in overview.minutes],
        dispatch_p99=[m.dispatch_lateness_p99_ms for m in overview.minutes],
        start_p50=[m.start_lateness_p50_ms for m in overview.minutes],
        start_p99=[m.start_lateness_p99_ms for m in overview.minutes],
        totals={s: overview.total.states.get(s, 0) for s in STACKED},
    )


def _charts(m: Minutes) -> dict[str, Any]:
    return {
        "runs_chart": svg(
            stacked_bars(
                m.times,
                [(s, m.by_state[s]) for s in STACKED],
                label="runs per minute by state",
                width=1100,
            )
        ),
        "success_chart": svg(
            line_chart(
                m.times,
                [Series("success rate", "l-success", m.success_rate)],
                unit="%",
                top=100,
                label="success rate per minute",
                width=540,
            )
        ),
        "lateness_chart": svg(
            line_chart(
                m.times,
                [
                    Series("dispatch p50", "l-dispatch50", m.dispatch_p50),
                    Series("dispatch p99", "l-dispatch99", m.dispatch_p99),
                    Series("start p50", "l-start50", m.start_p50),
                    Series("start p99", "l-start99", m.start_p99),
                ],
                unit=" ms",
                label="dispatch and start lateness per minute",
                width=540,
            )
        ),
    }


@router.get("/overview")
async def overview_page(request: Request, visit: Visit = Depends(signed_in)) -> Response:
    state = api_state(request)
    # The tenant's overview; the admin's before it chooses a tenant spans every tenant.
    overview = await overview_for(
        state.store,
        visit.tenant_id,
        minutes=MINUTES,
        now=await state.store.db_now(),
        default_share=state.settings.p0_reserved_share,
        worker_ttl=state.settings.worker_ttl,
    )
    m = minutes_of(overview)
    finished = sum(m.totals[s] for s in ("SUCCESS", "FAILED", "DEAD_LETTER"))
    rate = overview.total.success_rate
    return page(
        "overview.html",
        visit,
        title="Overview",
        section="overview",
        alerts=overview.alerts,
        pools=overview.pools,
        stacked=STACKED,
        minutes=m,
        finished=finished,
        success_pct=None if rate is None else 100 * rate,
        every_tenant=visit.tenant_id is None,
        **_charts(m),
    )
