"""Spread: each run's offset is a pure function of (job id, occurrence) inside the
window, the window is checked against the schedule, and catch-up reads spread instants."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.spec import CronSchedule, IntervalSchedule, JobSpec
from cronwheel.timing.catchup import MISFIRE_GRACE, plan_fire
from cronwheel.timing.spread import (
    check_spread,
    shortest_gap,
    spread_instant,
    spread_offset_us,
)

T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
JOB = uuid.UUID("8f14e45f-ceea-467f-a2a5-c0c0d7a1b2c3")


@given(
    job=st.uuids(),
    due=st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2999, 1, 1), timezones=st.just(UTC)
    ),
    ms=st.integers(min_value=0, max_value=86_400_000),
)
def test_the_offset_is_inside_the_window_and_the_same_every_time(
    job: uuid.UUID, due: datetime, ms: int
) -> None:
    spread = ms / 1000
    offset = spread_offset_us(job, due, spread)
    assert offset == spread_offset_us(uuid.UUID(str(job)), due.astimezone(UTC), spread)
    if ms == 0:
        assert offset == 0 and spread_instant(job, due, spread) == due
    else:
        assert 0 <= offset < ms * 1000
        assert spread_instant(job, due, spread) == due + timedelta(microseconds=offset)


def test_the_offset_depends_on_the_job_and_the_occurrence() -> None:
    other = uuid.UUID(int=JOB.int ^ 1)
    offsets = {spread_offset_us(JOB, T0 + timedelta(hours=h), 600) for h in range(50)}
    assert len(offsets) > 45  # a different offset for nearly every occurrence
    assert spread_offset_us(JOB, T0, 600) != spread_offset_us(other, T0, 600)
    # One more microsecond of due instant is another occurrence.
    assert spread_offset_us(JOB, T0, 600) != spread_offset_us(
        JOB, T0 + timedelta(microseconds=1), 600
    )


def test_a_thousand_jobs_on_one_instant_spread_evenly() -> None:
    offsets = [spread_offset_us(uuid.UUID(int=i * 7919), T0, 600) / 1e6 for i in range(1000)]
    buckets = [0] * 10
    for seconds in offsets:
        buckets[int(seconds // 60)] += 1
    assert min(buckets) >= 70 and max(buckets) <= 130, buckets


@pytest.mark.parametrize(
    ("cron", "gap"),
    [
        ("0 * * * *", 3600),
        ("*/5 * * * *", 300),
        ("*/7 * * * *", 240),  # minute 56 to the next hour's minute 0
        ("0 9,17 * * *", 8 * 3600),
        ("30 2 * * 1", 86400),
        ("*/10 * * * * *", 10),
        ("@daily", 86400),
    ],
)
def test_the_shortest_gap_of_a_cron_expression(cron: str, gap: int) -> None:
    assert shortest_gap(CronSchedule(cron=cron)) == gap


def _spec(schedule: dict[str, object], spread: float) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "s", "schedule": schedule, "task": "t", "spread": spread}
    )


def test_a_spread_must_be_shorter_than_the_shortest_interval() -> None:
    check_spread(_spec({"interval": 60}, 59.999))
    check_spread(_spec({"cron": "*/5 * * * *"}, 299))
    check_spread(_spec({"at": T0.isoformat()}, 86400))  # a one-off has no interval
    for schedule, spread in (({"interval": 60}, 60), ({"cron": "*/5 * * * *"}, 300)):
        with pytest.raises(ValidationError) as caught:
            check_spread(_spec(schedule, spread))
        assert caught.value.field == "spread" and "shortest interval" in caught.value.message


def test_a_spread_is_kept_to_whole_milliseconds() -> None:
    assert _spec({"interval": 60}, 1.23456).spread == 1.235
    for bad in (-1, 86400.5):
        with pytest.raises(ValueError, match="spread"):
            _spec({"interval": 86400 * 2}, bad)


# -- catch-up reads spread instants -------------------------------------------------

EVERY_MINUTE = IntervalSchedule(interval=60, catch_up="replay", catch_up_window=3600)


def _fires(spread: float) -> object:
    return lambda due: spread_instant(JOB, due, spread)


def test_lateness_is_counted_from_the_spread_instant() -> None:
    schedule = IntervalSchedule(interval=3600)
    offset = timedelta(microseconds=spread_offset_us(JOB, T0, 1800))
    now = T0 + offset + timedelta(seconds=30)
    assert now - T0 > MISFIRE_GRACE  # missed, were it counted from the due instant
    plan = plan_fire(
        schedule, due_at=T0, now=now, busy=False, waiting=False, spread_at=_fires(1800)
    )
    assert (plan.fate, plan.reason) == ("DISPATCHED", None)  # 30 s after its instant
    assert plan.next_due_at == T0 + timedelta(hours=1)

    late = T0 + offset + MISFIRE_GRACE + timedelta(seconds=1)
    plan = plan_fire(
        schedule, due_at=T0, now=late, busy=False, waiting=False, spread_at=_fires(1800)
    )
    assert plan.reason is not None and "late by 61 s" in plan.reason


def test_missed_occurrences_are_those_whose_spread_instant_passed() -> None:
    now = T0 + timedelta(minutes=10, seconds=20)
    fires = _fires(50)
    plan = plan_fire(EVERY_MINUTE, due_at=T0, now=now, busy=False, waiting=False, spread_at=fires)
    dues = [T0 + timedelta(minutes=k) for k in range(1, 12)]
    missed = [d for d in dues if spread_instant(JOB, d, 50) <= now]
    ahead = next(d for d in dues if spread_instant(JOB, d, 50) > now)
    assert ahead <= now + timedelta(minutes=1)
    replayed = [c.due_at for c in plan.created if c.state == "DISPATCHED"]
    assert replayed == missed
    [scheduled] = [c for c in plan.created if c.state == "SCHEDULED"]
    assert scheduled.due_at == plan.next_due_at == ahead
    # Without spread the same firing replays every occurrence up to now.
    plain = plan_fire(EVERY_MINUTE, due_at=T0, now=now, busy=False, waiting=False)
    assert [c.due_at for c in plain.created if c.state == "DISPATCHED"] == dues[:10]


def test_the_replay_window_is_counted_from_spread_instants() -> None:
    schedule = IntervalSchedule(interval=60, catch_up="replay", catch_up_window=100)
    now = T0 + timedelta(minutes=5)
    minute = [T0 + timedelta(minutes=k) for k in range(6)]
    # This job's offsets at 59 s: 24.4, 19.4, 26.7, 34.0 and 7.5 s for minutes 1-5.
    assert [round(spread_offset_us(JOB, d, 59) / 1e6, 1) for d in minute[1:]] == [
        24.4,
        19.4,
        26.7,
        34.0,
        7.5,
    ]
    plan = plan_fire(schedule, due_at=T0, now=now, busy=False, waiting=False, spread_at=_fires(59))
    by_state = {
        state: [c.due_at for c in plan.created if c.state == state]
        for state in ("DISPATCHED", "SKIPPED", "SCHEDULED")
    }
    # Minute 3 fired 93 s ago, inside the window; counted from its due instant it
    # would be 120 s, outside. Minute 5's spread instant is still ahead: the next run.
    assert by_state == {
        "DISPATCHED": minute[3:5],
        "SKIPPED": minute[1:3],
        "SCHEDULED": [minute[5]],
    }
    plain = plan_fire(schedule, due_at=T0, now=now, busy=False, waiting=False)
    assert [c.due_at for c in plain.created if c.state == "DISPATCHED"] == minute[4:6]
