"""The overview of a window of runs: counts by minute and state, and the dispatch and
start lateness percentiles, on runs whose instants are set by hand (the same numbers
on both backends: PostgreSQL's ``percentile_cont`` and SQLite's Python twin)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from cronwheel.domain.errors import ValidationError
from cronwheel.store import Store
from cronwheel.store.schema import runs
from cronwheel.store.sql import overview as overview_module
from cronwheel.store.sql.overview import percentile
from cronwheel.store.values import RunStats

from .helpers import T0, at, create_job, engine_of, make_tenant

TERMINAL = {"SUCCESS", "FAILED", "DEAD_LETTER", "CANCELLED", "SKIPPED"}


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


async def run_at(
    store: Store,
    tenant_id: uuid.UUID,
    due_at: datetime,
    state: str,
    *,
    dispatched: float | None = None,
    started: float | None = None,
    attempt: int = 1,
) -> uuid.UUID:
    """A run due at ``due_at`` (and fired at it) set by hand to ``state``, dispatched
    and started that many milliseconds after its fire instant (negative: ahead)."""
    _job, run = await create_job(store, tenant_id, due_at=due_at, now=T0 - timedelta(hours=1))
    values: dict[str, Any] = {
        "state": state,
        "fire_at": due_at,
        "dispatched_at": None if dispatched is None else due_at + ms(dispatched),
        "started_at": None if started is None else due_at + ms(started),
        "finished_at": due_at + timedelta(seconds=30) if state in TERMINAL else None,
        "attempt": attempt,
    }
    async with engine_of(store).begin() as conn:
        await conn.execute(sa.update(runs).where(runs.c.id == run.id).values(**values))
    return run.id


def lateness(stats: RunStats) -> tuple[float | None, ...]:
    return (stats.dispatch_p50_ms, stats.dispatch_p99_ms, stats.start_p50_ms, stats.start_p99_ms)


def nonzero(stats: RunStats) -> dict[str, int]:
    return {state: n for state, n in stats.states.items() if n}


async def test_runs_are_counted_by_minute_and_state_with_their_lateness(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    # Minute 0: four successes, dispatched 100..400 ms and started 1..4 s late.
    for i in range(1, 5):
        await run_at(store, tenant.id, at(i), "SUCCESS", dispatched=100 * i, started=1000 * i)
    # Minute 1: one run of each ending; only first tries count for start lateness, and a
    # run waiting for its retry (SCHEDULED again) or never dispatched not at all.
    await run_at(store, tenant.id, at(61), "FAILED", dispatched=50, started=60)
    await run_at(store, tenant.id, at(62), "DEAD_LETTER", dispatched=10, started=20, attempt=3)
    await run_at(store, tenant.id, at(63), "SCHEDULED", dispatched=-9000, attempt=1)
    await run_at(store, tenant.id, at(64), "CANCELLED")
    # Minute 2: dispatched ahead of its instant (a reservation): on time, not early.
    await run_at(store, tenant.id, at(121), "DISPATCHED", dispatched=-500)
    # Outside the window: just before it, at its end, and due after the cut.
    await run_at(store, tenant.id, at(-1), "SUCCESS", dispatched=1, started=1)
    await run_at(store, tenant.id, at(180), "SUCCESS", dispatched=1, started=1)
    await run_at(store, tenant.id, at(170), "SCHEDULED")
    # Another tenant's run in minute 0.
    await run_at(store, other.id, at(30), "SUCCESS", dispatched=1000, started=5000)

    got = await store.runs_overview(tenant.id, since=T0, minutes=3, until=at(165))
    assert (got.since, got.until) == (T0, at(165))
    assert [m.at for m in got.minutes] == [T0, at(60), at(120)]
    m0, m1, m2 = got.minutes
    assert set(m0.states) >= {"SCHEDULED", "SUCCESS", "DEAD_LETTER", "SKIPPED"}
    assert nonzero(m0) == {"SUCCESS": 4}
    # percentile_cont: p50 of 100..400 is 250; p99 is at rank 2.97, 300 + 0.97 x 100.
    assert lateness(m0) == pytest.approx((250, 397, 2500, 3970))
    assert nonzero(m1) == {"FAILED": 1, "DEAD_LETTER": 1, "SCHEDULED": 1, "CANCELLED": 1}
    assert lateness(m1) == pytest.approx((30, 49.6, 60, 60))
    assert nonzero(m2) == {"DISPATCHED": 1}
    assert lateness(m2) == pytest.approx((0, 0, None, None))
    total = got.total
    assert total.at == T0
    assert nonzero(total) == {
        "SUCCESS": 4,
        "FAILED": 1,
        "DEAD_LETTER": 1,
        "SCHEDULED": 1,
        "CANCELLED": 1,
        "DISPATCHED": 1,
    }
    # Dispatch: 0, 10, 50, 100, 200, 300, 400; start: 60, 1000, 2000, 3000, 4000.
    assert lateness(total) == pytest.approx((100, 394, 2000, 3960))

    # Every tenant's: the other tenant's run is in minute 0 too.
    every = await store.runs_overview(None, since=T0, minutes=3, until=at(165))
    assert nonzero(every.minutes[0]) == {"SUCCESS": 5}
    assert lateness(every.minutes[0]) == pytest.approx((300, 976, 3000, 4960))
    assert sum(every.total.states.values()) == 10
    # The other tenant's alone.
    theirs = await store.runs_overview(other.id, since=T0, minutes=3, until=at(165))
    assert nonzero(theirs.total) == {"SUCCESS": 1}
    assert [nonzero(m) for m in theirs.minutes] == [{"SUCCESS": 1}, {}, {}]


async def test_an_empty_window_has_every_minute_and_no_lateness(store: Store) -> None:
    tenant = await make_tenant(store)
    got = await store.runs_overview(tenant.id, since=T0, minutes=5)
    assert got.until == at(300)
    assert [m.at for m in got.minutes] == [at(60 * i) for i in range(5)]
    for stats in [*got.minutes, got.total]:
        assert nonzero(stats) == {}
        assert lateness(stats) == (None, None, None, None)


@pytest.mark.parametrize("minutes", [0, -1, 1441])
async def test_a_window_out_of_bounds_is_refused(store: Store, minutes: int) -> None:
    with pytest.raises(ValidationError) as caught:
        await store.runs_overview(None, since=T0, minutes=minutes)
    assert caught.value.field == "minutes"


async def test_a_window_ending_before_it_begins_is_refused(store: Store) -> None:
    with pytest.raises(ValidationError):
        await store.runs_overview(None, since=T0, minutes=5, until=T0)


def test_percentile_interpolates_as_percentile_cont() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([1.0, 2.0], 0.5) == 1.5
    assert percentile([0.0, 10.0, 20.0, 30.0, 40.0], 0.99) == pytest.approx(39.6)


async def test_every_tenants_runs_are_counted_however_many_tenants(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite reads the tenants in groups: groups of one here, so that three are read.
    monkeypatch.setattr(overview_module, "_SQLITE_IDS", 1)
    for n in range(3):
        tenant = await make_tenant(store)
        for i in range(n + 1):
            await run_at(store, tenant.id, at(10 * i), "SUCCESS", dispatched=100, started=200)
    got = await store.runs_overview(None, since=T0, minutes=1)
    assert nonzero(got.total) == {"SUCCESS": 6}
    assert lateness(got.total) == pytest.approx((100, 100, 200, 200))
