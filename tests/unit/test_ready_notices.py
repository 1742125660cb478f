"""Ready notices: the pool, and the instant the earliest run may be leased when it was
dispatched ahead of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronwheel.store.base import parse_ready_notice, ready_notices

AT = datetime(2031, 1, 1, 12, 0, tzinfo=UTC)


def test_one_notice_per_pool_with_the_earliest_instant_ahead() -> None:
    ahead = AT + timedelta(seconds=2, milliseconds=250)
    notices = ready_notices(
        [
            ("gpu", AT + timedelta(seconds=3)),
            ("gpu", ahead),
            ("default", AT - timedelta(seconds=1)),
            ("default", AT + timedelta(seconds=5)),
        ],
        AT,
    )
    assert [parse_ready_notice(n) for n in notices] == [("default", None), ("gpu", ahead)]


def test_a_plain_pool_name_is_leasable_now() -> None:
    assert ready_notices([("batch", AT)], AT) == ["batch"]
    assert parse_ready_notice("batch") == ("batch", None)
    # A pool name that merely looks like a notice's tail stays a name.
    assert parse_ready_notice("odd\x1fname") == ("odd\x1fname", None)
