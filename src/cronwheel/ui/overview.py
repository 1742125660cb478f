"""The overview page: the last hour minute by minute — runs by state, the success rate,
dispatch and start lateness (p50, p99) — with the alerts and each pool's workers and
free capacity."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from cronwheel.api.routers import alerts as alerts_api
from cronwheel.api.routers import pools as pools_api
from cronwheel.api.state import api_state
from cronwheel.domain.model import Run
from cronwheel.domain.states import RunState
from cronwheel.store.base import Store
from cronwheel.ui.charts import Series, line_chart, stacked_bars
from cronwheel.ui.render import UiRoute, page, svg
from cronwheel.ui.sessions import Visit, signed_in

__all__ = ["MINUTES", "STACKED", "Minutes", "interim_minutes", "router"]

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
    partial: bool = False  # more runs than were read: the counts are a sample


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


_INTERIM_PAGE = 500
_INTERIM_PAGES = 2


async def interim_minutes(
    store: Store, tenant_id: uuid.UUID, *, minutes: int, now: datetime
) -> Minutes:
    """The per-minute numbers from the tenant's newest runs, read by the runs listing a
    page at a time (at most 1,000 runs, each page one range of the tenant's id index):
    a stand-in until the store's own overview query is merged. Run ids grow with their
    creation, so the reading stops at the first run created well before the window."""
    start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
    read: list[Run] = []
    cursor: str | None = None
    partial = True
    for _ in range(_INTERIM_PAGES):
        page = await store.runs_list(tenant_id, cursor=cursor, limit=_INTERIM_PAGE)
        read += page.items
        cursor = page.next_cursor
        if cursor is None or page.items[-1].created_at < start - timedelta(hours=1):
            partial = False
            break
    times = [start + timedelta(minutes=i) for i in range(minutes)]
    by_state = {s: [0] * minutes for s in STACKED}
    finished: list[list[str]] = [[] for _ in range(minutes)]
    dispatch: list[list[float]] = [[] for _ in range(minutes)]
    starts: list[list[float]] = [[] for _ in range(minutes)]
    for run in read:
        i = int((run.due_at - start).total_seconds() // 60)
        if not 0 <= i < minutes:
            continue
        by_state[run.state.value][i] += 1
        if run.finished_at is not None:
            finished[i].append(run.state.value)
        if run.dispatched_at is not None:
            dispatch[i].append((run.dispatched_at - run.fire_at).total_seconds() * 1000)
        if run.started_at is not None:
            starts[i].append((run.started_at - run.fire_at).total_seconds() * 1000)
    rate: list[float | None] = []
    for done in finished:
        counted = [s for s in done if s in ("SUCCESS", "FAILED", "DEAD_LETTER")]
        rate.append(100 * counted.count("SUCCESS") / len(counted) if counted else None)
    return Minutes(
        times=times,
        by_state=by_state,
        success_rate=rate,
        dispatch_p50=[_percentile(v, 0.5) for v in dispatch],
        dispatch_p99=[_percentile(v, 0.99) for v in dispatch],
        start_p50=[_percentile(v, 0.5) for v in starts],
        start_p99=[_percentile(v, 0.99) for v in starts],
        totals={s: sum(c) for s, c in by_state.items()},
        partial=partial,
    )


def _charts(m: Minutes) -> dict[str, object]:
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
    store = api_state(request).store
    # The admin's view spans every tenant for alerts and pools; charts need a tenant.
    fleet_tenant = None if visit.is_admin else visit.tenant_id
    alerts = await alerts_api.list_alerts(request=request, tenant_id=fleet_tenant)
    pools = await pools_api.list_pools(request=request, tenant_id=fleet_tenant)
    context: dict[str, Any] = {"minutes": None}
    if visit.tenant_id is not None:
        now = await store.db_now_estimate()
        m = await interim_minutes(store, visit.tenant_id, minutes=MINUTES, now=now)
        finished = sum(m.totals[s] for s in ("SUCCESS", "FAILED", "DEAD_LETTER"))
        context = {
            "minutes": m,
            "finished": finished,
            "success_pct": None if not finished else 100 * m.totals["SUCCESS"] / finished,
            **_charts(m),
        }
    return page(
        "overview.html",
        visit,
        title="Overview",
        section="overview",
        alerts=alerts.items,
        pools=pools.items,
        stacked=STACKED,
        **context,
    )
