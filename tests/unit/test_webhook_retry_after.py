"""``Retry-After``: delay-seconds or an HTTP date, into the seconds a retry waits."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cronwheel.domain.spec import MAX_RETRY_AFTER
from cronwheel.worker.webhook import parse_retry_after

NOW = datetime(2025, 1, 1, 0, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0.0), ("5", 5.0), (" 120 ", 120.0), ("007", 7.0), ("86400", 86400.0)],
)
def test_delay_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize(
    "value",
    # the three date formats HTTP accepts: IMF-fixdate, RFC 850 and asctime
    [
        "Wed, 01 Jan 2025 00:00:30 GMT",
        "Wednesday, 01-Jan-25 00:00:30 GMT",
        "Wed Jan  1 00:00:30 2025",
    ],
)
def test_http_dates_are_measured_from_now(value: str) -> None:
    assert parse_retry_after(value, now=NOW) == 30.0


def test_an_http_date_is_measured_from_the_answers_own_date_header() -> None:
    # The receiver's clock says 00:00:10; ours says 00:00:00: the wait is 20 s, not 30.
    got = parse_retry_after(
        "Wed, 01 Jan 2025 00:00:30 GMT", date="Wed, 01 Jan 2025 00:00:10 GMT", now=NOW
    )
    assert got == 20.0
    # An unreadable Date falls back to our clock.
    assert parse_retry_after("Wed, 01 Jan 2025 00:00:30 GMT", date="yesterday", now=NOW) == 30.0


def test_a_date_in_the_past_means_now() -> None:
    assert parse_retry_after("Tue, 31 Dec 2024 23:59:00 GMT", now=NOW) == 0.0


def test_without_now_the_machines_clock_is_used() -> None:
    got = parse_retry_after("Wed, 01 Jan 2025 00:00:30 GMT")
    assert got == 0.0  # that instant is long past


@pytest.mark.parametrize(
    "value", [None, "", "  ", "soon", "-5", "1.5", "5s", "Wed, 32 Jan 2025 00:00:30 GMT", "٣"]
)
def test_malformed_values_are_ignored(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_waits_are_capped() -> None:
    assert parse_retry_after("999999999999", now=NOW) == MAX_RETRY_AFTER
    # Past the digits int() takes (4,300): still the cap, not an error.
    assert parse_retry_after("9" * 5000, now=NOW) == MAX_RETRY_AFTER
    assert parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", now=NOW) == MAX_RETRY_AFTER
