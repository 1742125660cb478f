"""The public functions of ``cronwheel.timing``: first_due, next_after, intervals,
validation, previews and the local forms the API shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import pydantic
import pytest

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import (
    AsapSchedule,
    AtSchedule,
    CronSchedule,
    DelaySchedule,
    IntervalSchedule,
)
from cronwheel.timing import (
    compile_schedule,
    due_local,
    first_due,
    iter_occurrences,
    next_after,
    next_occurrence,
    occurrences,
    upcoming,
    validate_schedule,
)

HORIZON = timedelta(days=3 * 366)
GRACE = timedelta(seconds=300)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def due(schedule: object, now: datetime, horizon: timedelta = HORIZON) -> datetime:
    return first_due(schedule, now, max_horizon=horizon, past_grace=GRACE)  # type: ignore[arg-type]


# -- first_due ---------------------------------------------------------------------------


def test_first_due_of_a_cron_schedule_is_at_or_after_now() -> None:
    spec = CronSchedule(cron="30 1 * * *", timezone="America/New_York")
    assert due(spec, utc("2026-06-01T12:00")) == utc("2026-06-02T05:30")
    assert due(spec, utc("2026-06-02T05:30")) == utc("2026-06-02T05:30")  # at now: now
    assert due(spec, utc("2026-06-02T05:30:00.000001")) == utc("2026-06-03T05:30")


def test_first_due_honours_the_dst_policies() -> None:
    spec = CronSchedule(cron="30 2 8 3 *", timezone="America/New_York")
    assert due(spec, utc("2026-03-01T00:00")) == utc("2026-03-08T07:00")  # shifted
    skip = spec.model_copy(update={"on_nonexistent": "skip"})
    assert due(skip, utc("2026-03-01T00:00")) == utc("2027-03-08T07:30")  # a Monday, EDT


def test_first_due_of_an_interval_without_start_is_aligned_to_the_epoch() -> None:
    spec = IntervalSchedule(interval=300)
    assert due(spec, utc("2026-06-01T12:03:10")) == utc("2026-06-01T12:05")
    assert due(spec, utc("2026-06-01T12:05")) == utc("2026-06-01T12:05")


def test_first_due_of_an_interval_with_start() -> None:
    start = datetime(2026, 6, 1, 9, 0, 7, tzinfo=timezone(timedelta(hours=2)))
    spec = IntervalSchedule(interval=3600, start=start)
    assert due(spec, utc("2026-05-01T00:00")) == utc("2026-06-01T07:00:07")  # the start
    assert due(spec, utc("2026-06-03T10:30")) == utc("2026-06-03T11:00:07")


def test_first_due_beyond_the_horizon_names_the_field() -> None:
    spec = CronSchedule(cron="0 0 29 2 *")
    with pytest.raises(InvalidScheduleError) as caught:
        due(spec, utc("2026-03-01T00:00"), horizon=timedelta(days=365))
    assert caught.value.field == "schedule.cron"
    later = IntervalSchedule(interval=60, start=utc("2035-01-01T00:00"))
    with pytest.raises(InvalidScheduleError) as caught:
        due(later, utc("2026-03-01T00:00"))
    assert caught.value.field == "schedule.start"


def test_first_due_rejects_an_invalid_cron_and_zone() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        due(CronSchedule(cron="61 * * * *"), utc("2026-01-01T00:00"))
    assert caught.value.field == "schedule.cron"
    assert caught.value.message == "minute field '61' is out of range 0-59"
    with pytest.raises(InvalidScheduleError) as caught:
        due(CronSchedule(cron="* * * * *", timezone="Europe/Atlantis"), utc("2026-01-01T00:00"))
    assert caught.value.field == "schedule.timezone"
    assert "'Europe/Atlantis'" in caught.value.message


def test_first_due_of_one_off_schedules_is_unchanged() -> None:
    now = utc("2026-06-01T12:00")
    assert due(AsapSchedule(asap=True), now) == now
    assert due(DelaySchedule(delay=90), now) == now + timedelta(seconds=90)
    assert due(AtSchedule(at=utc("2026-06-02T00:00")), now) == utc("2026-06-02T00:00")
    with pytest.raises(InvalidScheduleError) as caught:
        due(AtSchedule(at=utc("2026-05-01T00:00")), now)
    assert caught.value.field == "schedule.at"


# -- next_after ---------------------------------------------------------------------------


def test_next_after_is_strictly_after() -> None:
    spec = CronSchedule(cron="*/5 * * * *")
    assert next_after(spec, utc("2026-01-01T00:05")) == utc("2026-01-01T00:10")
    assert next_after(spec, utc("2026-01-01T00:04:59.999999")) == utc("2026-01-01T00:05")
    assert next_after(spec, utc("2025-12-31T23:59:30")) == utc("2026-01-01T00:00")


def test_next_after_accepts_any_aware_instant_and_refuses_naive_ones() -> None:
    spec = CronSchedule(cron="0 * * * *")
    paris = datetime(2026, 6, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert next_after(spec, paris) == utc("2026-06-01T11:00")
    assert next_after(spec, paris).tzinfo is UTC  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="aware"):
        next_after(spec, datetime(2026, 6, 1))


def test_next_after_takes_a_compiled_schedule() -> None:
    spec = CronSchedule(cron="0 9 * * mon-fri", timezone="Asia/Kolkata")
    compiled = compile_schedule(spec)
    assert compile_schedule(spec) is compiled
    assert compile_schedule(compiled) is compiled
    assert next_after(compiled, utc("2026-07-03T04:00")) == utc("2026-07-06T03:30")


def test_next_after_near_the_end_of_time() -> None:
    assert next_after(CronSchedule(cron="0 0 1 1 *"), utc("9998-06-01T00:00")) is None
    assert next_after(IntervalSchedule(interval=86400), datetime.max.replace(tzinfo=UTC)) is None


def test_next_occurrence_gives_the_local_form_and_kind() -> None:
    spec = CronSchedule(cron="30 1 * * *", timezone="America/New_York", on_ambiguous="all")
    first = next_occurrence(spec, utc("2026-11-01T00:00"))
    assert first is not None
    assert (first.local, first.kind) == ("2026-11-01T01:30:00-04:00", "ambiguous-first")
    second = next_occurrence(spec, first.utc)
    assert second is not None
    assert (second.local, second.kind) == ("2026-11-01T01:30:00-05:00", "ambiguous-second")


# -- intervals -----------------------------------------------------------------------------


def test_intervals_count_elapsed_time_across_dst() -> None:
    start = datetime(2026, 3, 8, 0, 0, tzinfo=timezone(timedelta(hours=-5)))
    spec = IntervalSchedule(interval=3600, start=start)
    got = list(iter_occurrences(spec, utc("2026-03-08T05:00"), utc("2026-03-08T10:00")))
    assert [o.utc for o in got] == [utc(f"2026-03-08T{h:02}:00") for h in range(5, 10)]
    assert {b.utc - a.utc for a, b in pairwise(got)} == {timedelta(hours=1)}
    assert got[0].local == "2026-03-08T05:00:00+00:00"  # no zone applies: UTC


def test_fractional_intervals_do_not_drift() -> None:
    spec = IntervalSchedule(interval=1.1, start=utc("2026-01-01T00:00"))
    instant = utc("2026-01-01T00:00")
    for _ in range(10_000):
        nxt = next_after(spec, instant)
        assert nxt is not None
        instant = nxt
    assert instant == utc("2026-01-01T03:03:20")  # exactly 11,000 s


@pytest.mark.parametrize("seconds", [0.5, 0.999, float("inf"), float("nan"), 3700 * 86400.0])
def test_intervals_out_of_bounds_are_refused_by_the_model(seconds: float) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        IntervalSchedule(interval=seconds)
    assert caught.value.errors()[0]["loc"] == ("interval",)


@pytest.mark.parametrize("seconds", [0.5, 0.999])
def test_a_stored_interval_shorter_than_a_second_is_refused(seconds: float) -> None:
    """A schedule that never went through the model (a row written by hand)."""
    with pytest.raises(InvalidScheduleError) as caught:
        validate_schedule(IntervalSchedule.model_construct(interval=seconds, start=None))
    assert caught.value.field == "schedule.interval"
    assert "minimum is 1 s" in caught.value.message


def test_a_stored_infinite_interval_is_refused() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        validate_schedule(IntervalSchedule.model_construct(interval=float("inf"), start=None))
    assert caught.value.field == "schedule.interval"


# -- validation and previews -------------------------------------------------------------


def test_validate_schedule() -> None:
    validate_schedule(CronSchedule(cron="@hourly", timezone="Pacific/Chatham"))
    validate_schedule(AtSchedule(at=utc("2026-01-01T00:00")))  # nothing to check here
    with pytest.raises(InvalidScheduleError) as caught:
        validate_schedule(CronSchedule(cron="0 0 * * 1#2"))
    assert caught.value.field == "schedule.cron"


@pytest.mark.parametrize(
    ("on_ambiguous", "on_nonexistent", "field"),
    [
        ("both", "shift", "schedule.on_ambiguous"),
        ("first", "later", "schedule.on_nonexistent"),
    ],
)
def test_occurrences_refuses_unknown_policies(
    on_ambiguous: str, on_nonexistent: str, field: str
) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        occurrences(
            "* * * * *",
            "UTC",
            utc("2026-01-01T00:00"),
            utc("2026-01-02T00:00"),
            on_ambiguous=on_ambiguous,
            on_nonexistent=on_nonexistent,
        )
    assert caught.value.field == field


def test_occurrences_limit_and_empty_ranges() -> None:
    start, end = utc("2026-01-01T00:00"), utc("2026-01-02T00:00")
    assert len(occurrences("* * * * *", "UTC", start, end, limit=5)) == 5
    assert occurrences("* * * * *", "UTC", end, start) == []
    assert occurrences("* * * * *", "UTC", start, start) == []
    with pytest.raises(ValueError, match="start must be"):
        occurrences("* * * * *", "UTC", datetime(2026, 1, 1), end)


def test_upcoming_is_a_preview_from_now() -> None:
    spec = CronSchedule(cron="0 12 * * *", timezone="Europe/Paris")
    got = upcoming(spec, utc("2026-03-28T11:00"), 3)
    assert [o.local for o in got] == [
        "2026-03-28T12:00:00+01:00",
        "2026-03-29T12:00:00+02:00",
        "2026-03-30T12:00:00+02:00",
    ]
    assert upcoming(spec, utc("2026-03-28T11:00"), 0) == []


def test_skipped_wall_times_come_before_a_run_due_at_the_same_instant() -> None:
    spec = CronSchedule(cron="0 2,3 * * *", timezone="America/New_York", on_nonexistent="skip")
    got = list(
        iter_occurrences(
            spec, utc("2026-03-08T00:00"), utc("2026-03-09T00:00"), include_skipped=True
        )
    )
    assert [(o.utc, o.local, o.kind) for o in got] == [
        (utc("2026-03-08T07:00"), "2026-03-08T02:00:00", "skipped"),
        (utc("2026-03-08T07:00"), "2026-03-08T03:00:00-04:00", "normal"),
    ]
    assert got[0].reason is not None and "on_nonexistent is 'skip'" in got[0].reason
    # Without include_skipped, only what runs.
    assert [o.kind for o in iter_occurrences(spec, got[0].utc, utc("2026-03-09T00:00"))] == [
        "normal"
    ]


def test_due_local() -> None:
    cron = CronSchedule(cron="30 1 * * *", timezone="America/New_York")
    assert due_local(cron, utc("2026-11-01T06:30")) == "2026-11-01T01:30:00-05:00"
    at = AtSchedule(at=datetime(2026, 6, 1, 9, 0, tzinfo=timezone(timedelta(hours=5, minutes=30))))
    assert due_local(at, utc("2026-06-01T03:30")) == "2026-06-01T09:00:00+05:30"
    assert due_local(IntervalSchedule(interval=60), utc("2026-06-01T03:30")) is None
    assert due_local(DelaySchedule(delay=5), utc("2026-06-01T03:30")) is None
