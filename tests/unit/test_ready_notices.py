"""Ready notices: the pool, and the instants its runs may be leased from when they were
dispatched ahead of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronwheel.store.notices import parse_ready_notice, ready_notices

AT = datetime(2031, 1, 1, 12, 0, tzinfo=UTC)


def test_every_instant_ahead_is_carried_and_runs_due_now_wake_at_once() -> None:
    first = AT + timedelta(seconds=2, milliseconds=250)
    later = AT + timedelta(seconds=3)
    notices = ready_notices(
        [
            ("gpu", later),
            ("gpu", first),
            ("gpu", later),
            ("default", AT - timedelta(seconds=1)),
            ("default", AT + timedelta(seconds=5)),
        ],
        AT,
    )
    assert [parse_ready_notice(n) for n in notices] == [
        ("default", []),
        ("default", [AT + timedelta(seconds=5)]),
        ("gpu", [first, later]),
    ]


def test_a_wide_batch_is_woken_at_evenly_spaced_instants_ending_with_its_last() -> None:
    runs = [("p", AT + timedelta(milliseconds=10 * i)) for i in range(1, 101)]
    [notice] = ready_notices(runs, AT)
    pool, instants = parse_ready_notice(notice)
    assert pool == "p" and len(instants) == 32
    assert instants == sorted(instants) and instants[-1] == AT + timedelta(seconds=1)
    # Every run has a wake at or after its instant, at most four runs' spacing later.
    for _, fire_at in runs:
        wake = min(i for i in instants if i >= fire_at)
        assert wake - fire_at <= timedelta(milliseconds=40)
    assert len(notice.encode()) < 8000  # a NOTIFY payload's limit


def test_a_plain_pool_name_is_leasable_now() -> None:
    assert ready_notices([("batch", AT)], AT) == ["batch"]
    assert parse_ready_notice("batch") == ("batch", [])
    # A pool name that merely looks like a notice's tail stays a name.
    assert parse_ready_notice("odd\x1fname") == ("odd\x1fname", [])
