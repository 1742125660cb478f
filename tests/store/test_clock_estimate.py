"""``db_now_estimate``: the database clock without a round trip, on both backends.

Its promise (``store/base.py``): never ahead of the database clock, re-measured once
the measured offset is older than its age, and measured by one caller at a time. The
age is driven by moving the recorded read time back, never by sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import pytest

from cronwheel.store import Store
from cronwheel.store.sql import SqlStore
from cronwheel.store.sql.core import _CLOCK_MAX_AGE


def _sql(store: Store) -> SqlStore:
    assert isinstance(store, SqlStore)
    return store


def _count_reads(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the store's reads of the database clock (each still reads it)."""
    reads = [0]
    real: Callable[[], Awaitable[datetime]] = store.db_now

    async def counted() -> datetime:
        reads[0] += 1
        return await real()

    monkeypatch.setattr(store, "db_now", counted)
    return reads


def _age(store: SqlStore, seconds: float) -> None:
    """Make the measured offset ``seconds`` old."""
    store._clock_read_at = time.monotonic() - seconds


async def test_the_estimate_is_never_ahead_of_the_database_clock(store: Store) -> None:
    sql = _sql(store)
    for i in range(200):
        if i % 50 == 0:
            _age(sql, _CLOCK_MAX_AGE + 1)  # measured again now and then
        estimate = await store.db_now_estimate()
        db = await store.db_now()
        assert estimate.utcoffset() == timedelta(0)
        assert estimate <= db, (i, estimate, db)
        # Behind by no more than a round trip (a loose bound: a busy machine).
        assert db - estimate < timedelta(seconds=2)


async def test_the_offset_is_measured_again_after_its_age(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = _sql(store)
    reads = _count_reads(sql, monkeypatch)
    await store.db_now_estimate()
    assert reads == [1]
    # A stale offset (an hour behind) serves as long as it is younger than the age...
    sql._clock_offset = timedelta(hours=-1)
    _age(sql, _CLOCK_MAX_AGE - 1)
    estimate = await store.db_now_estimate()
    assert reads == [1]
    assert await store.db_now() - estimate > timedelta(minutes=59)
    # ...and is measured again once older.
    _age(sql, _CLOCK_MAX_AGE + 1)
    estimate = await store.db_now_estimate()
    assert reads == [3]  # the db_now() above, and the measurement
    db = await store.db_now()
    assert timedelta(0) <= db - estimate < timedelta(seconds=2)
    assert time.monotonic() - sql._clock_read_at < _CLOCK_MAX_AGE


async def _concurrent_estimates(store: SqlStore, count: int) -> list[datetime]:
    return list(await asyncio.gather(*(store.db_now_estimate() for _ in range(count))))


async def test_callers_during_a_measurement_do_not_measure_too(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = _sql(store)
    reads = _count_reads(sql, monkeypatch)
    await store.db_now_estimate()
    _age(sql, _CLOCK_MAX_AGE + 1)
    estimates = await _concurrent_estimates(sql, 20)
    # One measures; the others go on with the offset they have.
    assert reads == [2]
    assert max(estimates) <= await store.db_now()


async def test_callers_before_the_first_measurement_wait_for_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = _sql(store)
    reads = _count_reads(sql, monkeypatch)
    # A process that starts under load: no offset yet, twenty callers at once.
    estimates = await _concurrent_estimates(sql, 20)
    assert reads == [1]
    assert max(estimates) <= await store.db_now()


async def test_a_failed_first_measurement_is_tried_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = _sql(store)
    real = sql.db_now
    failures = [1]

    async def flaky() -> datetime:
        if failures[0]:
            failures[0] -= 1
            raise OSError("connection refused")
        return await real()

    monkeypatch.setattr(sql, "db_now", flaky)
    outcomes = await asyncio.gather(
        *(store.db_now_estimate() for _ in range(3)), return_exceptions=True
    )
    # The caller that measured gets the failure; those that waited measure again.
    assert [type(o) for o in outcomes].count(OSError) == 1
    assert sum(isinstance(o, datetime) for o in outcomes) == 2
    assert sql._clock_offset is not None
