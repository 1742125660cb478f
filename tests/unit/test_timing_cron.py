"""Cron syntax and calendar: fields, names, macros, the day rule, leap days, short
months, the leading second field, and errors that point at the bad field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import MAX_CRON_LENGTH
from cronwheel.timing import occurrences, parse_cron
from cronwheel.timing.cron import MACROS


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def days(expr: str, start: str, end: str, tz: str = "UTC") -> list[str]:
    return [u.strftime("%Y-%m-%d") for u in occurrences(expr, tz, utc(start), utc(end))]


def test_leap_days_over_eight_years() -> None:
    got = occurrences("0 0 29 2 *", "UTC", utc("2024-01-01T00:00"), utc("2032-12-31T00:00"))
    assert got == [utc("2024-02-29T00:00"), utc("2028-02-29T00:00"), utc("2032-02-29T00:00")]


def test_leap_days_skip_the_century_that_is_not_leap() -> None:
    got = occurrences("0 0 29 2 *", "UTC", utc("2096-03-01T00:00"), utc("2105-01-01T00:00"))
    assert got == [utc("2104-02-29T00:00")]
    got = occurrences("0 0 29 2 *", "UTC", utc("1996-03-01T00:00"), utc("2001-01-01T00:00"))
    assert got == [utc("2000-02-29T00:00")]


def test_leap_day_in_a_zone_east_of_utc() -> None:
    got = occurrences("0 0 29 2 *", "Asia/Tokyo", utc("2024-01-01T00:00"), utc("2029-01-01T00:00"))
    assert got == [utc("2024-02-28T15:00"), utc("2028-02-28T15:00")]


def test_the_31st_only_in_months_that_have_one() -> None:
    assert days("0 0 31 * *", "2026-01-01T00:00", "2027-01-01T00:00") == [
        "2026-01-31",
        "2026-03-31",
        "2026-05-31",
        "2026-07-31",
        "2026-08-31",
        "2026-10-31",
        "2026-12-31",
    ]


def test_the_30th_is_every_month_but_february() -> None:
    got = days("0 0 30 * *", "2026-01-01T00:00", "2027-01-01T00:00")
    assert len(got) == 11
    assert not any(d.startswith("2026-02") for d in got)


def test_when_both_day_fields_are_restricted_either_matches() -> None:
    # The 13th, or any Friday, in March 2026 (the 13th is itself a Friday).
    assert days("0 0 13 * fri", "2026-03-01T00:00", "2026-04-01T00:00") == [
        "2026-03-06",
        "2026-03-13",
        "2026-03-20",
        "2026-03-27",
    ]
    assert days("0 0 1,15 * mon", "2026-06-01T00:00", "2026-07-01T00:00") == [
        "2026-06-01",
        "2026-06-08",
        "2026-06-15",
        "2026-06-22",
        "2026-06-29",
    ]


def test_a_day_field_that_starts_with_a_star_is_not_restricted() -> None:
    # cron(5): "*/2" starts with "*", so both fields must match: odd days that are Mondays.
    assert days("0 0 */2 * mon", "2026-06-01T00:00", "2026-07-01T00:00") == [
        "2026-06-01",
        "2026-06-15",
        "2026-06-29",
    ]
    assert days("0 0 ? * mon", "2026-06-01T00:00", "2026-06-15T00:00") == [
        "2026-06-01",
        "2026-06-08",
    ]


def test_weekday_seven_and_zero_are_sunday() -> None:
    sundays = ["2026-06-07", "2026-06-14"]
    for expr in ("0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "0 0 * * SUN", "0 0 * * 7-7"):
        assert days(expr, "2026-06-01T00:00", "2026-06-15T00:00") == sundays, expr


def test_names_ranges_lists_and_steps() -> None:
    got = occurrences(
        "5-59/15 9 * jan,jul mon-fri", "UTC", utc("2026-07-01T00:00"), utc("2026-07-02T00:00")
    )
    assert [u.strftime("%H:%M") for u in got] == ["09:05", "09:20", "09:35", "09:50"]
    assert days("0 0 1 JAN-MAR *", "2026-01-01T00:00", "2027-01-01T00:00") == [
        "2026-01-01",
        "2026-02-01",
        "2026-03-01",
    ]


def test_a_one_value_range_is_that_value() -> None:
    # croniter reads "58-58" as "*"; cronwheel hands it the value.
    got = occurrences("58-58 * * * *", "UTC", utc("2026-01-01T00:00"), utc("2026-01-01T03:00"))
    assert [u.strftime("%H:%M") for u in got] == ["00:58", "01:58", "02:58"]
    assert parse_cron("0 0 * mar-mar sun-sun").months == frozenset({3})


def test_a_sixth_field_is_a_leading_second_field() -> None:
    got = occurrences("30 */20 * * * *", "UTC", utc("2026-01-01T00:00"), utc("2026-01-01T01:00"))
    assert [u.strftime("%H:%M:%S") for u in got] == ["00:00:30", "00:20:30", "00:40:30"]
    got = occurrences("*/15 0 0 * * *", "UTC", utc("2026-01-01T00:00"), utc("2026-01-01T00:01"))
    assert [u.strftime("%M:%S") for u in got] == ["00:00", "00:15", "00:30", "00:45"]
    assert parse_cron("7 */5 * * * *").has_seconds
    assert not parse_cron("*/5 * * * *").has_seconds


@pytest.mark.parametrize("macro", sorted(MACROS))
def test_macros_are_their_expressions(macro: str) -> None:
    start, end = utc("2025-12-01T00:00"), utc("2027-02-01T00:00")
    assert occurrences(macro, "Europe/Paris", start, end) == occurrences(
        MACROS[macro], "Europe/Paris", start, end
    )
    assert occurrences(macro.upper(), "UTC", start, start + timedelta(days=40)) == occurrences(
        MACROS[macro], "UTC", start, start + timedelta(days=40)
    )


def test_macro_meanings() -> None:
    start, end = utc("2026-01-01T00:00"), utc("2027-01-01T00:00")
    assert len(occurrences("@yearly", "UTC", start, end)) == 1
    assert len(occurrences("@annually", "UTC", start, end)) == 1
    assert len(occurrences("@monthly", "UTC", start, end)) == 12
    assert len(occurrences("@weekly", "UTC", start, end)) == 52  # 2026 has 52 Sundays
    assert len(occurrences("@daily", "UTC", start, end)) == 365
    assert len(occurrences("@midnight", "UTC", start, end)) == 365
    assert len(occurrences("@hourly", "UTC", start, end)) == 365 * 24


def test_whitespace_is_forgiven() -> None:
    assert parse_cron("  0   9 * *\tmon ") == parse_cron("0 9 * * mon")


@pytest.mark.parametrize(
    ("expr", "cron_field", "message"),
    [
        ("61 * * * *", "minute", "minute field '61' is out of range 0-59"),
        ("* 24 * * *", "hour", "hour field '24' is out of range 0-23"),
        ("0 0 0 * *", "day-of-month", "day-of-month field '0' is out of range 1-31"),
        ("0 0 32 * *", "day-of-month", "day-of-month field '32' is out of range 1-31"),
        ("0 0 * 13 *", "month", "month field '13' is out of range 1-12 or jan-dec"),
        ("0 0 * * 8", "day-of-week", "day-of-week field '8' is out of range 0-7 or sun-sat"),
        ("60 * * * * *", "second", "second field '60' is out of range 0-59"),
        ("1-60/5 * * * *", "minute", "minute field '1-60/5' is out of range 0-59"),
        ("*/0 * * * *", "minute", "minute field '*/0' has a step of 0"),
        ("0,,5 * * * *", "minute", "minute field '0,,5' has an empty list item"),
        ("MON * * * *", "minute", "'mon' is not a number"),
        ("0 0 * foo *", "month", "'foo' is neither a number nor a month name"),
        ("0 0 * * funday", "day-of-week", "'funday' is neither a number nor a weekday name"),
        ("0 0 L * *", "day-of-month", "extension (L, W, #, H or R)"),
        ("0 0 15W * *", "day-of-month", "extension"),
        ("0 0 * * 5L", "day-of-week", "extension"),
        ("0 0 * * 1#2", "day-of-week", "extension"),
        ("H * * * *", "minute", "extension"),
        ("R * * * *", "minute", "extension"),
        ("? * * * *", "minute", "'?' is only allowed in day fields"),
        ("0 0 1-31/x * *", "day-of-month", "step that is not a number"),
        ("-1 * * * *", "minute", "minute field '-1'"),
        ("0 0 30 2 *", "day-of-month", "never occurs in month field '2'"),
        ("0 0 31 apr,jun *", "day-of-month", "never occurs"),
    ],
)
def test_invalid_fields_are_named(expr: str, cron_field: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron(expr)
    error = caught.value
    assert error.field == "schedule.cron"
    assert error.status == 422
    assert error.code == "invalid_schedule"
    assert error.details == {"cron_field": cron_field}
    assert message in error.message


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "the cron expression is empty"),
        ("   ", "the cron expression is empty"),
        ("* * * *", "has 4"),
        ("0 0 1 1 * 2030 x", "has 7"),
        ("@reboot", "unknown cron macro '@reboot'"),
        ("@every 5m", "unknown cron macro"),
    ],
)
def test_invalid_shapes_are_explained(expr: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron(expr)
    assert caught.value.field == "schedule.cron"
    assert message in caught.value.message


def refusal(expr: str) -> InvalidScheduleError:
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron(expr)
    assert (caught.value.field, caught.value.status) == ("schedule.cron", 422)
    return caught.value


@pytest.mark.parametrize(
    ("expr", "cron_field", "written", "instead"),
    [
        ("5-1 * * * *", "minute", "5-1", "5-59,0-1"),
        ("0 22-2 * * *", "hour", "22-2", "22-23,0-2"),
        ("0 0 25-5 * *", "day-of-month", "25-5", "25-31,1-5"),
        ("0 0 1 11-2 *", "month", "11-2", "11-12,1-2"),
        ("0 0 1 dec-jan *", "month", "dec-jan", "dec,jan"),
        ("0 0 * * fri-mon", "day-of-week", "fri-mon", "fri-sat,sun-mon"),
        ("0 0 * * sat-sun", "day-of-week", "sat-sun", "sat,sun"),
        ("0 0 * * 5-1", "day-of-week", "5-1", "5-6,0-1"),
        ("0 0 * * 7-1", "day-of-week", "7-1", "0-1"),
        ("50-10/5 * * * *", "minute", "50-10/5", "50-59/5,0-10/5"),
        ("0,59-10/5 * * * *", "minute", "59-10/5", "59,0-10/5"),
        ("30-10 0 * * * *", "second", "30-10", "30-59,0-10"),
    ],
)
def test_a_reversed_range_is_refused_with_the_ranges_that_say_it(
    expr: str, cron_field: str, written: str, instead: str
) -> None:
    error = refusal(expr)
    assert error.details == {"cron_field": cron_field}
    assert f"the range '{written}' runs backwards" in error.message
    assert f"write '{instead}'" in error.message
    # The advice is itself accepted.
    assert parse_cron(expr.replace(written, instead, 1))


def test_the_advice_for_a_reversed_range_keeps_what_a_wrap_meant() -> None:
    assert parse_cron("0 0 * * fri-sat,sun-mon").weekdays == frozenset({5, 6, 0, 1})
    assert parse_cron("0 22-23,0-2 * * *").hours == frozenset({22, 23, 0, 1, 2})
    assert parse_cron("5-59,0-1 * * * *").minutes == frozenset(range(60)) - {2, 3, 4}


@pytest.mark.parametrize(
    ("expr", "cron_field", "size"),
    [
        ("*/0 * * * *", "minute", 60),
        ("*/61 * * * *", "minute", 60),
        ("*/100000000000000000000 * * * *", "minute", 60),
        ("0,15,1-59/61 * * * *", "minute", 60),
        ("5/99 * * * *", "minute", 60),
        ("*/61 * * * * *", "second", 60),
        ("0 */25 * * *", "hour", 24),
        ("0 0 */32 * *", "day-of-month", 31),
        ("0 0 ?/32 * mon", "day-of-month", 31),
        ("0 0 1 */13 *", "month", 12),
        ("0 0 * * */8", "day-of-week", 7),
        ("0 0 * * mon-fri/8", "day-of-week", 7),
    ],
)
def test_a_step_is_at_most_the_number_of_values_of_its_field(
    expr: str, cron_field: str, size: int
) -> None:
    error = refusal(expr)
    assert error.details == {"cron_field": cron_field}
    assert "has a step of" in error.message
    assert f"from 1 to {size}, the number of values of the {cron_field} field" in error.message


def test_a_step_as_long_as_its_field_names_its_first_value() -> None:
    assert parse_cron("*/60 * * * *").minutes == frozenset({0})
    assert parse_cron("*/60 0 * * * *").seconds == frozenset({0})
    assert parse_cron("0 */24 * * *").hours == frozenset({0})
    assert parse_cron("0 0 */31 * *").days == frozenset({1})
    assert parse_cron("0 0 1 */12 *").months == frozenset({1})
    assert parse_cron("0 0 * * */7").weekdays == frozenset({0})
    assert parse_cron("0 0 * * 1-7/7").weekdays == frozenset({1})


def test_a_field_has_at_most_as_many_list_items_as_values() -> None:
    every_minute = ",".join(str(m) for m in range(60))
    assert parse_cron(f"{every_minute} * * * *").minutes == frozenset(range(60))
    error = refusal(f"{every_minute},0 * * * *")
    assert error.details == {"cron_field": "minute"}
    assert "has 61 list items; at most 60" in error.message
    assert len(parse_cron("0 0 * * sun,mon,tue,wed,thu,fri,sat").weekdays) == 7
    error = refusal("0 0 * * 0,1,2,3,4,5,6,7")
    assert error.details == {"cron_field": "day-of-week"}
    assert "has 8 list items; at most 7" in error.message
    assert refusal("0 0 1 1,2,3,4,5,6,7,8,9,10,11,12,1 *").details == {"cron_field": "month"}


def test_an_expression_is_at_most_max_cron_length_characters() -> None:
    assert MAX_CRON_LENGTH == 256
    padded = "0 9 * * mon".ljust(MAX_CRON_LENGTH)
    assert parse_cron(padded) == parse_cron("0 9 * * mon")
    error = refusal(padded + " ")
    assert error.message == (
        f"the cron expression is {MAX_CRON_LENGTH + 1} characters long; "
        f"at most {MAX_CRON_LENGTH} are allowed"
    )
    assert error.details == {}
    # The outside probe's 30 KB of list items: refused before any field is read.
    huge = ",".join(["1"] * 15_000) + " * * * *"
    assert "at most 256 are allowed" in refusal(huge).message


def test_parsing_is_cached() -> None:
    assert parse_cron("*/7 * * * *") is parse_cron("*/7 * * * *")
