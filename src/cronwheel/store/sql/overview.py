"""The overview of a window of runs: by the minute they are due, how many are in each
state now and how late they were dispatched and started (``RunStats``).

Costs. Only the runs due in the window are read, through a range of the
``(tenant_id, due_at)`` index: one range for a tenant, one per tenant for the admin
(``tenant_id = ANY(ids)``, the ids read from ``tenants`` first), so the table's other
runs — older history, far-future occurrences — are never touched, whatever their
number. PostgreSQL counts and takes the percentiles itself (``percentile_cont``, one
statement, the window's total as the ``ROLLUP`` row); SQLite has no ordered-set
aggregates, so it returns the window's few columns and Python does the same
arithmetic (``percentile``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.states import RunState
from cronwheel.store.schema import runs, tenants
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import RunsOverview, RunStats

__all__ = ["OVERVIEW_MINUTES_MAX", "OverviewMixin", "percentile"]

OVERVIEW_MINUTES_MAX = 1440
_STATES = [s.value for s in RunState]
_SQLITE_IDS = 500  # tenant ids bound in one SQLite statement


def percentile(values: Sequence[float], p: float) -> float | None:
    """PostgreSQL's ``percentile_cont(p)`` of ``values`` (sorted): the value at rank
    ``p * (n - 1)``, interpolated linearly between its two neighbours."""
    if not values:
        return None
    rank = p * (len(values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _ms(later: datetime, earlier: datetime) -> float:
    return max(0.0, (later - earlier).total_seconds() * 1000.0)


@dataclass
class _Stretch:
    """The runs of one minute (or of the window) as SQLite's rows are read."""

    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_STATES, 0))
    dispatch: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)

    def add(self, row: Any) -> None:
        self.states[row.state] = self.states.get(row.state, 0) + 1
        if row.dispatched_at is not None and row.state != RunState.SCHEDULED.value:
            self.dispatch.append(_ms(row.dispatched_at, row.fire_at))
        if row.started_at is not None and row.attempt <= 1:
            self.start.append(_ms(row.started_at, row.fire_at))

    def stats(self, at: datetime) -> RunStats:
        self.dispatch.sort()
        self.start.sort()
        return RunStats(
            at=at,
            states=self.states,
            dispatch_p50_ms=percentile(self.dispatch, 0.5),
            dispatch_p99_ms=percentile(self.dispatch, 0.99),
            start_p50_ms=percentile(self.start, 0.5),
            start_p99_ms=percentile(self.start, 0.99),
        )


def _empty(at: datetime) -> RunStats:
    return RunStats(
        at=at,
        states=dict.fromkeys(_STATES, 0),
        dispatch_p50_ms=None,
        dispatch_p99_ms=None,
        start_p50_ms=None,
        start_p99_ms=None,
    )


def _epoch(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    # date_part answers a double; EXTRACT a numeric (PostgreSQL 14 on), whose arithmetic
    # made the whole statement a third slower over a day's window of 140,000 runs.
    return sa.func.date_part("epoch", column, type_=sa.Float)


def _late_ms(later: sa.ColumnElement[Any], when: sa.ColumnElement[bool]) -> Any:
    """Milliseconds from ``fire_at`` to ``later``, never below 0; NULL (not counted
    by the percentiles) where ``when`` does not hold."""
    ms = sa.func.greatest(0.0, (_epoch(later) - _epoch(runs.c.fire_at)) * 1000.0)
    return sa.case((when, ms), else_=sa.null())


class OverviewMixin(SqlCore):
    async def runs_overview(
        self,
        tenant_id: uuid.UUID | None,
        *,
        since: datetime,
        minutes: int,
        until: datetime | None = None,
    ) -> RunsOverview:
        if not 1 <= minutes <= OVERVIEW_MINUTES_MAX:
            raise ValidationError(
                f"minutes must be between 1 and {OVERVIEW_MINUTES_MAX}", field="minutes"
            )
        end = since + timedelta(minutes=minutes)
        until = end if until is None else min(until, end)
        if until <= since:
            raise ValidationError("the window must end after it begins", field="until")
        async with self._read() as conn:
            if tenant_id is not None:
                ids = [tenant_id]
            else:
                ids = list((await conn.execute(sa.select(tenants.c.id))).scalars())
            if self.driver.dialect == "postgresql":
                window = self._window(ids, since, until)
                rows = (await conn.execute(self._overview_sql(window, since))).all()
                by_minute, total = _from_sql(rows, since)
            else:
                columns = (
                    runs.c.due_at,
                    runs.c.fire_at,
                    runs.c.dispatched_at,
                    runs.c.started_at,
                    runs.c.state,
                    runs.c.attempt,
                )
                # SQLite binds each id: tenants in groups, within its bound on them.
                found: list[Any] = []
                for at in range(0, len(ids), _SQLITE_IDS):
                    window = self._window(ids[at : at + _SQLITE_IDS], since, until)
                    found += (await conn.execute(sa.select(*columns).where(window))).all()
                by_minute, total = _from_rows(found, since)
        starts = [since + timedelta(minutes=i) for i in range(minutes)]
        return RunsOverview(
            since=since,
            until=until,
            minutes=[by_minute.get(i) or _empty(at) for i, at in enumerate(starts)],
            total=total,
        )

    def _window(
        self, ids: Sequence[uuid.UUID], since: datetime, until: datetime
    ) -> sa.ColumnElement[bool]:
        """The runs of ``ids`` due in ``[since, until)``: a range of the
        ``(tenant_id, due_at)`` index per tenant."""
        return sa.and_(
            self.driver.id_in(runs.c.tenant_id, ids), runs.c.due_at >= since, runs.c.due_at < until
        )

    @staticmethod
    def _overview_sql(window: sa.ColumnElement[bool], since: datetime) -> sa.Select[Any]:
        minute = sa.cast(
            sa.func.floor((_epoch(runs.c.due_at) - since.timestamp()) / 60), sa.Integer
        ).label("minute")
        dispatch = _late_ms(
            runs.c.dispatched_at,
            sa.and_(runs.c.dispatched_at.is_not(None), runs.c.state != RunState.SCHEDULED.value),
        )
        start = _late_ms(
            runs.c.started_at, sa.and_(runs.c.started_at.is_not(None), runs.c.attempt <= 1)
        )
        counts = [sa.func.count().filter(runs.c.state == s).label(f"n_{s}") for s in _STATES]
        # Both percentiles of one sort: percentile_cont of an array of fractions.
        floats = postgresql.ARRAY(sa.Float)
        fractions = sa.literal([0.5, 0.99], floats)
        quantiles = [
            sa.func.percentile_cont(fractions, type_=floats).within_group(expr).label(name)
            for name, expr in (("dispatch", dispatch), ("start", start))
        ]
        columns: list[Any] = [minute, *counts, *quantiles]
        return sa.select(*columns).where(window).group_by(sa.func.rollup(minute))


def _from_sql(rows: Sequence[Any], since: datetime) -> tuple[dict[int, RunStats], RunStats]:
    by_minute: dict[int, RunStats] = {}
    total = _empty(since)
    for row in rows:
        at = since if row.minute is None else since + timedelta(minutes=row.minute)
        stats = RunStats(
            at=at,
            states={s: int(row._mapping[f"n_{s}"]) for s in _STATES},
            dispatch_p50_ms=_nth(row.dispatch, 0),
            dispatch_p99_ms=_nth(row.dispatch, 1),
            start_p50_ms=_nth(row.start, 0),
            start_p99_ms=_nth(row.start, 1),
        )
        if row.minute is None:
            total = stats
        else:
            by_minute[int(row.minute)] = stats
    return by_minute, total


def _from_rows(rows: Iterable[Any], since: datetime) -> tuple[dict[int, RunStats], RunStats]:
    stretches: dict[int, _Stretch] = {}
    whole = _Stretch()
    for row in rows:
        i = int((row.due_at - since).total_seconds() // 60)
        stretch = stretches.get(i)
        if stretch is None:
            stretch = stretches[i] = _Stretch()
        stretch.add(row)
        whole.add(row)
    by_minute = {i: s.stats(since + timedelta(minutes=i)) for i, s in stretches.items()}
    return by_minute, whole.stats(since)


def _nth(values: Sequence[Any] | None, i: int) -> float | None:
    """The ``i``-th of the percentiles PostgreSQL answered (None: no value to rank)."""
    return None if values is None or values[i] is None else float(values[i])
