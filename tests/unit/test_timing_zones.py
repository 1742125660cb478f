"""Table tests: the zones whose transitions are known to trip schedulers, each
around its transitions, with the expected instants written out by hand."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import CronSchedule
from cronwheel.timing import (
    iter_occurrences,
    local_form,
    next_after,
    occurrences,
    skipped_nonexistent,
)
from cronwheel.timing.zones import MAX_JUMP, get_zone, year_pieces


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def runs(
    expr: str,
    tz: str,
    start: str,
    end: str,
    *,
    on_ambiguous: str = "first",
    on_nonexistent: str = "shift",
) -> list[tuple[str, str, str]]:
    """``(utc, local, kind)`` of each occurrence in ``[start, end)``."""
    spec = CronSchedule(
        cron=expr,
        timezone=tz,
        on_ambiguous=on_ambiguous,
        on_nonexistent=on_nonexistent,
    )
    got: list[tuple[str, str, str]] = [
        (o.utc.strftime("%Y-%m-%dT%H:%M:%SZ"), o.local, o.kind)
        for o in iter_occurrences(spec, utc(start), utc(end))
    ]
    # The plain API agrees with the detailed one.
    plain = occurrences(
        expr,
        tz,
        utc(start),
        utc(end),
        on_ambiguous=on_ambiguous,
        on_nonexistent=on_nonexistent,
    )
    assert [u.strftime("%Y-%m-%dT%H:%M:%SZ") for u in plain] == [g[0] for g in got]
    return got


# -- America/New_York: the reference case -------------------------------------------


def test_new_york_spring_forward_shifts_to_the_transition_instant() -> None:
    assert runs("30 2 * * *", "America/New_York", "2026-03-07T00:00", "2026-03-10T00:00") == [
        ("2026-03-07T07:30:00Z", "2026-03-07T02:30:00-05:00", "normal"),
        ("2026-03-08T07:00:00Z", "2026-03-08T03:00:00-04:00", "shifted"),
        ("2026-03-09T06:30:00Z", "2026-03-09T02:30:00-04:00", "normal"),
    ]


def test_new_york_spring_forward_skip_leaves_the_day_out_and_says_why() -> None:
    got = runs(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00",
        "2026-03-10T00:00",
        on_nonexistent="skip",
    )
    assert [g[0] for g in got] == ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"]
    [skip] = skipped_nonexistent(
        "30 2 * * *", "America/New_York", utc("2026-03-07T00:00"), utc("2026-03-10T00:00")
    )
    assert skip.utc == utc("2026-03-08T07:00")
    assert skip.local == "2026-03-08T02:30:00"
    assert skip.kind == "skipped"
    assert skip.reason is not None
    assert "2026-03-08T02:30:00 does not exist in America/New_York" in skip.reason
    assert "2026-03-08T02:00:00 to 2026-03-08T03:00:00" in skip.reason


def test_new_york_gap_collapses_into_one_firing_never_a_duplicate() -> None:
    # 02:00 and 02:30 do not exist; 03:00 fires anyway: one run at 07:00Z.
    assert runs("*/30 * * * *", "America/New_York", "2026-03-08T06:00", "2026-03-08T08:00") == [
        ("2026-03-08T06:00:00Z", "2026-03-08T01:00:00-05:00", "normal"),
        ("2026-03-08T06:30:00Z", "2026-03-08T01:30:00-05:00", "normal"),
        ("2026-03-08T07:00:00Z", "2026-03-08T03:00:00-04:00", "normal"),
        ("2026-03-08T07:30:00Z", "2026-03-08T03:30:00-04:00", "normal"),
    ]
    # Without 03:00 in the expression, 02:00 and 02:30 still make only one run.
    assert runs("0,30 2 * * *", "America/New_York", "2026-03-08T06:00", "2026-03-08T08:00") == [
        ("2026-03-08T07:00:00Z", "2026-03-08T03:00:00-04:00", "shifted"),
    ]


def test_the_shifted_run_names_what_it_replaces() -> None:
    spec = CronSchedule(cron="0,30 2 * * *", timezone="America/New_York")
    [run] = iter_occurrences(spec, utc("2026-03-08T06:00"), utc("2026-03-08T08:00"))
    assert run.nominal == "2026-03-08T02:00:00"
    assert run.reason is not None
    assert "and 1 more in the same gap" in run.reason
    assert "shifted to the first instant after the gap" in run.reason


def test_new_york_fall_back_first_fires_once_at_the_earlier_instant() -> None:
    assert runs("30 1 * * *", "America/New_York", "2026-11-01T00:00", "2026-11-02T00:00") == [
        ("2026-11-01T05:30:00Z", "2026-11-01T01:30:00-04:00", "ambiguous-first"),
    ]


def test_new_york_fall_back_all_fires_twice_with_distinct_offsets() -> None:
    got = runs(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T00:00",
        "2026-11-02T00:00",
        on_ambiguous="all",
    )
    assert got == [
        ("2026-11-01T05:30:00Z", "2026-11-01T01:30:00-04:00", "ambiguous-first"),
        ("2026-11-01T06:30:00Z", "2026-11-01T01:30:00-05:00", "ambiguous-second"),
    ]


def test_new_york_fall_back_every_20_minutes() -> None:
    first = runs("*/20 1 * * *", "America/New_York", "2026-11-01T04:00", "2026-11-01T08:00")
    assert [g[1] for g in first] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:20:00-04:00",
        "2026-11-01T01:40:00-04:00",
    ]
    every = runs(
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T04:00",
        "2026-11-01T08:00",
        on_ambiguous="all",
    )
    assert [g[1] for g in every] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:20:00-04:00",
        "2026-11-01T01:40:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T01:20:00-05:00",
        "2026-11-01T01:40:00-05:00",
    ]


def test_next_after_inside_the_fold() -> None:
    first = CronSchedule(cron="*/20 1 * * *", timezone="America/New_York")
    every = first.model_copy(update={"on_ambiguous": "all"})
    inside_second_pass = utc("2026-11-01T06:10")  # 01:10 EST
    assert next_after(every, inside_second_pass) == utc("2026-11-01T06:20")
    # "first": the rest of the second pass is a repeat, so the next run is tomorrow.
    assert next_after(first, inside_second_pass) == utc("2026-11-02T06:00")
    # Late in the first pass, the second pass still lies ahead for "all".
    assert next_after(every, utc("2026-11-01T05:50")) == utc("2026-11-01T06:00")
    assert next_after(first, utc("2026-11-01T05:50")) == utc("2026-11-02T06:00")


# -- Australia/Lord_Howe: 30-minute shifts --------------------------------------------


def test_lord_howe_spring_forward_by_thirty_minutes() -> None:
    # 2026-10-04 02:00 +10:30 becomes 02:30 +11:00 at 15:30Z.
    assert runs("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T00:00", "2026-10-05T00:00") == [
        ("2026-10-02T15:45:00Z", "2026-10-03T02:15:00+10:30", "normal"),
        ("2026-10-03T15:30:00Z", "2026-10-04T02:30:00+11:00", "shifted"),
        ("2026-10-04T15:15:00Z", "2026-10-05T02:15:00+11:00", "normal"),
    ]
    got = runs("*/15 2 * * *", "Australia/Lord_Howe", "2026-10-03T15:00", "2026-10-03T16:00")
    assert got == [
        ("2026-10-03T15:30:00Z", "2026-10-04T02:30:00+11:00", "normal"),
        ("2026-10-03T15:45:00Z", "2026-10-04T02:45:00+11:00", "normal"),
    ]


def test_lord_howe_fall_back_by_thirty_minutes() -> None:
    # 2026-04-05 02:00 +11:00 becomes 01:30 +10:30 at 15:00Z: 01:30-01:59 twice.
    got = runs(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:00",
        "2026-04-04T18:00",
        on_ambiguous="all",
    )
    assert got == [
        ("2026-04-04T14:45:00Z", "2026-04-05T01:45:00+11:00", "ambiguous-first"),
        ("2026-04-04T15:15:00Z", "2026-04-05T01:45:00+10:30", "ambiguous-second"),
    ]
    # 01:15 happens once only: before the repeated half hour.
    assert runs(
        "15 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:00",
        "2026-04-04T18:00",
        on_ambiguous="all",
    ) == [("2026-04-04T14:15:00Z", "2026-04-05T01:15:00+11:00", "normal")]


# -- America/Santiago and America/Havana: transitions at midnight -------------------


def test_santiago_midnight_does_not_exist_on_the_first_sunday_of_september() -> None:
    assert runs("@daily", "America/Santiago", "2026-09-05T00:00", "2026-09-08T00:00") == [
        ("2026-09-05T04:00:00Z", "2026-09-05T00:00:00-04:00", "normal"),
        ("2026-09-06T04:00:00Z", "2026-09-06T01:00:00-03:00", "shifted"),
        ("2026-09-07T03:00:00Z", "2026-09-07T00:00:00-03:00", "normal"),
    ]
    skipped = runs(
        "@daily",
        "America/Santiago",
        "2026-09-05T00:00",
        "2026-09-08T00:00",
        on_nonexistent="skip",
    )
    assert [g[1] for g in skipped] == ["2026-09-05T00:00:00-04:00", "2026-09-07T00:00:00-03:00"]


def test_santiago_repeats_the_last_hour_of_saturday_in_april() -> None:
    # 2026-04-04 23:59:59 -03:00 is followed by 23:00 -04:00.
    got = runs(
        "30 23 * * *",
        "America/Santiago",
        "2026-04-04T12:00",
        "2026-04-06T00:00",
        on_ambiguous="all",
    )
    assert got == [
        ("2026-04-05T02:30:00Z", "2026-04-04T23:30:00-03:00", "ambiguous-first"),
        ("2026-04-05T03:30:00Z", "2026-04-04T23:30:00-04:00", "ambiguous-second"),
    ]
    # Midnight of the Sunday happens once, after the repeated hour.
    assert runs("@daily", "America/Santiago", "2026-04-05T00:00", "2026-04-06T00:00") == [
        ("2026-04-05T04:00:00Z", "2026-04-05T00:00:00-04:00", "normal"),
    ]


def test_havana_midnight_is_skipped_in_march_and_repeated_in_november() -> None:
    assert runs("@midnight", "America/Havana", "2026-03-07T00:00", "2026-03-09T12:00") == [
        ("2026-03-07T05:00:00Z", "2026-03-07T00:00:00-05:00", "normal"),
        ("2026-03-08T05:00:00Z", "2026-03-08T01:00:00-04:00", "shifted"),
        ("2026-03-09T04:00:00Z", "2026-03-09T00:00:00-04:00", "normal"),
    ]
    # 2026-11-01 00:59:59 -04:00 is followed by 00:00 -05:00.
    assert runs("@midnight", "America/Havana", "2026-11-01T00:00", "2026-11-02T00:00") == [
        ("2026-11-01T04:00:00Z", "2026-11-01T00:00:00-04:00", "ambiguous-first"),
    ]
    assert runs(
        "@midnight",
        "America/Havana",
        "2026-11-01T00:00",
        "2026-11-02T00:00",
        on_ambiguous="all",
    ) == [
        ("2026-11-01T04:00:00Z", "2026-11-01T00:00:00-04:00", "ambiguous-first"),
        ("2026-11-01T05:00:00Z", "2026-11-01T00:00:00-05:00", "ambiguous-second"),
    ]


# -- odd offsets -----------------------------------------------------------------------


def test_kolkata_half_hour_offset_and_no_transitions() -> None:
    assert runs("0 9 * * mon-fri", "Asia/Kolkata", "2026-07-03T00:00", "2026-07-07T00:00") == [
        ("2026-07-03T03:30:00Z", "2026-07-03T09:00:00+05:30", "normal"),
        ("2026-07-06T03:30:00Z", "2026-07-06T09:00:00+05:30", "normal"),
    ]
    assert len(year_pieces(get_zone("Asia/Kolkata"), 2026)) == 1


def test_chatham_quarter_hour_offsets_and_their_transitions() -> None:
    # Winter: 12:00 +12:45 is 23:15Z the day before.
    assert runs("0 12 * * *", "Pacific/Chatham", "2026-07-01T00:00", "2026-07-02T00:00") == [
        ("2026-07-01T23:15:00Z", "2026-07-02T12:00:00+12:45", "normal"),
    ]
    # 2026-09-27 02:45 +12:45 becomes 03:45 +13:45 at 14:00Z: 03:00 does not exist.
    assert runs("0 3 * * *", "Pacific/Chatham", "2026-09-26T00:00", "2026-09-28T00:00") == [
        ("2026-09-26T14:00:00Z", "2026-09-27T03:45:00+13:45", "shifted"),
        ("2026-09-27T13:15:00Z", "2026-09-28T03:00:00+13:45", "normal"),
    ]
    # 2026-04-05 03:45 +13:45 becomes 02:45 +12:45 at 14:00Z: 03:00 happens twice.
    assert runs(
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-04-04T00:00",
        "2026-04-05T00:00",
        on_ambiguous="all",
    ) == [
        ("2026-04-04T13:15:00Z", "2026-04-05T03:00:00+13:45", "ambiguous-first"),
        ("2026-04-04T14:15:00Z", "2026-04-05T03:00:00+12:45", "ambiguous-second"),
    ]


# -- Pacific/Apia: a calendar day that never happened --------------------------------


def test_apia_skipped_the_30th_of_december_2011() -> None:
    assert runs("0 9 * * *", "Pacific/Apia", "2011-12-28T00:00", "2011-12-31T12:00") == [
        ("2011-12-28T19:00:00Z", "2011-12-28T09:00:00-10:00", "normal"),
        ("2011-12-29T19:00:00Z", "2011-12-29T09:00:00-10:00", "normal"),
        ("2011-12-30T10:00:00Z", "2011-12-31T00:00:00+14:00", "shifted"),
        ("2011-12-30T19:00:00Z", "2011-12-31T09:00:00+14:00", "normal"),
    ]


def test_apia_a_date_that_only_existed_in_other_years() -> None:
    spec = CronSchedule(cron="0 9 30 12 *", timezone="Pacific/Apia", on_nonexistent="skip")
    # Next year, on daylight saving time (+14:00).
    assert next_after(spec, utc("2011-06-01T00:00")) == utc("2012-12-29T19:00")
    [skip] = skipped_nonexistent(
        "0 9 30 12 *", "Pacific/Apia", utc("2011-06-01T00:00"), utc("2012-06-01T00:00")
    )
    assert (skip.utc, skip.local) == (utc("2011-12-30T10:00"), "2011-12-30T09:00:00")


def test_apia_a_whole_day_of_half_hours_becomes_one_run() -> None:
    got = runs("*/30 * * * *", "Pacific/Apia", "2011-12-30T09:00", "2011-12-30T11:00")
    assert got == [
        ("2011-12-30T09:00:00Z", "2011-12-29T23:00:00-10:00", "normal"),
        ("2011-12-30T09:30:00Z", "2011-12-29T23:30:00-10:00", "normal"),
        ("2011-12-30T10:00:00Z", "2011-12-31T00:00:00+14:00", "normal"),
        ("2011-12-30T10:30:00Z", "2011-12-31T00:30:00+14:00", "normal"),
    ]
    skipped = skipped_nonexistent(
        "*/30 * * * *", "Pacific/Apia", utc("2011-12-30T00:00"), utc("2011-12-31T00:00")
    )
    assert len(skipped) == 48
    assert {s.utc for s in skipped} == {utc("2011-12-30T10:00")}


# -- the assumptions the transition tables rest on -----------------------------------


def test_the_tz_database_still_fits_the_probe_step() -> None:
    """Each (zone, year) is probed every 12 hours: that finds every transition only while
    no two offset changes are closer than that, and the fold handling assumes no change
    exceeds a day. A tz database release that breaks either must fail here, loudly."""
    pure = pytest.importorskip("zoneinfo._zoneinfo")
    closest = timedelta(days=365)
    largest = timedelta(0)
    for key in sorted(zoneinfo.available_timezones()):
        zone = pure.ZoneInfo.no_cache(key)
        if not hasattr(zone, "_trans_utc"):  # pragma: no cover - private layout changed
            pytest.skip("the pure-Python zoneinfo no longer exposes its transitions")
        previous_offset = zone._tti_before.utcoff if zone._tti_before else None
        changes = []
        for when, info in zip(zone._trans_utc, zone._ttinfos, strict=True):
            if previous_offset is not None and info.utcoff != previous_offset:
                changes.append(when)
                largest = max(largest, abs(info.utcoff - previous_offset))
            previous_offset = info.utcoff
        for a, b in pairwise(changes):
            closest = min(closest, timedelta(seconds=b - a))
    assert closest > timedelta(hours=12) * 2
    assert largest <= MAX_JUMP - timedelta(hours=1)


def test_year_tables_find_the_transitions() -> None:
    ny = get_zone("America/New_York")
    assert [(start.isoformat(), str(offset)) for start, offset, _ in year_pieces(ny, 2026)] == [
        ("2026-01-01T00:00:00", "-1 day, 19:00:00"),
        ("2026-03-08T07:00:00", "-1 day, 20:00:00"),
        ("2026-11-01T06:00:00", "-1 day, 19:00:00"),
    ]
    apia = get_zone("Pacific/Apia")
    assert ("2011-12-30T10:00:00", "14:00:00", "-1 day, 14:00:00") in [
        (start.isoformat(), str(offset), str(before))
        for start, offset, before in year_pieces(apia, 2011)
    ]


# -- zone names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("Mars/Olympus_Mons", None),
        ("america/new_york", "America/New_York"),
        ("utc", "UTC"),
        ("localtime", None),
        ("../etc/passwd", None),
        ("/etc/localtime", None),
        ("America", None),
        ("", None),
    ],
)
def test_unknown_zones_are_refused_by_name(name: str, hint: str | None) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        occurrences("* * * * *", name, utc("2026-01-01T00:00"), utc("2026-01-02T00:00"))
    assert caught.value.field == "schedule.timezone"
    assert f"'{name}'" in caught.value.message
    if hint is not None:
        assert f"did you mean '{hint}'" in caught.value.message


def test_local_form_carries_each_instants_own_offset() -> None:
    assert local_form(utc("2026-11-01T05:30"), "America/New_York") == "2026-11-01T01:30:00-04:00"
    assert local_form(utc("2026-11-01T06:30"), "America/New_York") == "2026-11-01T01:30:00-05:00"
    assert local_form(utc("2026-01-01T00:00"), "Pacific/Chatham") == "2026-01-01T13:45:00+13:45"
    with pytest.raises(ValueError, match="aware"):
        local_form(datetime(2026, 1, 1), "UTC")
