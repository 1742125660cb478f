"""The due window: runs by instant, and bursts handed out a lead early."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from cronwheel.domain.model import DueRun
from cronwheel.scheduler.window import DueWindow

T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
LEAD = timedelta(seconds=5)


def _runs(seconds: float, count: int, shard: int = 0) -> list[DueRun]:
    at = T0 + timedelta(seconds=seconds)
    return [DueRun(id=uuid.uuid4(), shard=shard, fire_at=at) for _ in range(count)]


def test_a_burst_goes_a_lead_early_and_a_lone_run_at_its_instant() -> None:
    window = DueWindow(burst=3)
    alone, burst, later = _runs(2, 1), _runs(3, 3), _runs(9, 3)
    assert window.push([*alone, *burst, *later]) == 7
    assert window.push(burst) == 0  # held once
    assert len(window) == 7
    # The next thing due is the burst at 3 s, five seconds early: now.
    assert window.next_fire_at(LEAD) == T0 - timedelta(seconds=2)
    got = window.pop_due(T0, LEAD)
    assert {r.id for r in got} == {r.id for r in burst}
    assert all(r.fire_at == T0 + timedelta(seconds=3) for r in got)
    # Then the lone run at its own instant, then the burst at 9 s a lead early (4 s).
    assert window.next_fire_at(LEAD) == T0 + timedelta(seconds=2)
    assert window.pop_due(T0 + timedelta(seconds=1), LEAD) == []
    assert [r.id for r in window.pop_due(T0 + timedelta(seconds=2), LEAD)] == [alone[0].id]
    assert window.next_fire_at(LEAD) == T0 + timedelta(seconds=4)
    assert {r.id for r in window.pop_due(T0 + timedelta(seconds=4), LEAD)} == {r.id for r in later}
    assert len(window) == 0 and window.next_fire_at(LEAD) is None


def test_without_a_lead_everything_goes_at_its_instant_soonest_first() -> None:
    window = DueWindow(burst=2)
    first, second = _runs(1, 2), _runs(2, 1)
    window.push([*second, *first])
    assert window.next_fire_at() == T0 + timedelta(seconds=1)
    got = window.pop_due(T0 + timedelta(seconds=2))
    assert [r.fire_at for r in got] == [first[0].fire_at] * 2 + [second[0].fire_at]


def test_runs_arriving_at_an_instant_already_handed_out_are_held_again() -> None:
    window = DueWindow(burst=2)
    window.push(_runs(3, 2))
    assert len(window.pop_due(T0, LEAD)) == 2
    late = _runs(3, 1)  # created after its instant's burst went out
    window.push(late)
    assert window.next_fire_at(LEAD) == T0 + timedelta(seconds=3)
    assert window.pop_due(T0, LEAD) == []
    assert [r.id for r in window.pop_due(T0 + timedelta(seconds=3), LEAD)] == [late[0].id]


def test_dropping_shards_keeps_the_rest_and_their_bursts() -> None:
    window = DueWindow(burst=2)
    mine, theirs = _runs(3, 2, shard=1), _runs(3, 2, shard=2)
    window.push([*mine, *theirs])
    window.drop_shards({2})
    assert len(window) == 2
    assert {r.id for r in window.pop_due(T0, LEAD)} == {r.id for r in mine}
    assert window.push(theirs) == 2  # forgotten, so new again


def test_a_run_held_for_its_instant_is_never_handed_out_ahead() -> None:
    window = DueWindow(burst=1)
    ahead, kept = _runs(3, 2), _runs(3, 1)
    window.push(ahead)
    window.push(kept, at_instant=True)
    assert {r.id for r in window.pop_due(T0, LEAD)} == {r.id for r in ahead}
    # The instant's other run waits for it, and counts toward no burst.
    assert len(window) == 1
    assert window.next_fire_at(LEAD) == T0 + timedelta(seconds=3)
    alone = _runs(4, 1)
    window.push(alone, at_instant=True)
    assert window.pop_due(T0 + timedelta(seconds=1), LEAD) == []
    # Kept across a shard hand-over of others.
    window.drop_shards({7})
    assert window.pop_due(T0 + timedelta(seconds=2), LEAD) == []
    assert [r.id for r in window.pop_due(T0 + timedelta(seconds=3), LEAD)] == [kept[0].id]
    assert [r.id for r in window.pop_due(T0 + timedelta(seconds=4), LEAD)] == [alone[0].id]
    assert len(window) == 0


def test_a_run_pushed_at_another_instant_moves_there() -> None:
    """A run's fire time changed (its job edited) while the window held it: pushed again
    at its new instant — announced, or read by a poll — it is held there only."""
    window = DueWindow()
    [run] = _runs(20, 1)
    [other] = _runs(20, 1)
    window.push([run, other])
    earlier = DueRun(id=run.id, shard=run.shard, fire_at=T0 + timedelta(seconds=5))
    assert window.push([earlier]) == 0  # moved, not new
    assert len(window) == 2 and window.next_fire_at() == earlier.fire_at
    assert window.pop_due(T0 + timedelta(seconds=5)) == [earlier]
    later = DueRun(id=other.id, shard=other.shard, fire_at=T0 + timedelta(seconds=40))
    window.push([later])
    assert window.pop_due(T0 + timedelta(seconds=20)) == []
    assert window.pop_due(T0 + timedelta(seconds=40)) == [later]
    assert len(window) == 0 and window.next_fire_at() is None


def test_a_notices_millisecond_is_not_a_move() -> None:
    # Notices carry whole milliseconds; the run read exactly stays where it is held.
    window = DueWindow()
    exact = DueRun(id=uuid.uuid4(), shard=0, fire_at=T0 + timedelta(microseconds=1500))
    window.push([DueRun(id=exact.id, shard=0, fire_at=T0 + timedelta(milliseconds=1))])
    assert window.push([exact]) == 0
    assert window.pop_due(T0 + timedelta(milliseconds=1)) == [
        DueRun(id=exact.id, shard=0, fire_at=T0 + timedelta(milliseconds=1))
    ]


def test_a_burst_left_by_a_moved_run_still_goes_ahead() -> None:
    window = DueWindow(burst=2)
    burst = _runs(3, 2)
    window.push(burst)
    moved = DueRun(id=burst[0].id, shard=0, fire_at=T0 + timedelta(seconds=30))
    window.push([moved])
    assert [r.id for r in window.pop_due(T0, LEAD)] == [burst[1].id]
    assert len(window) == 1
