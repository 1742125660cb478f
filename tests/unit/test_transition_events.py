"""A transition event is built only for a transition the state machine allows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from cronwheel.domain.errors import IllegalTransitionError
from cronwheel.domain.states import TRANSITIONS, RunState, illegal_transitions
from cronwheel.store.rows import event_row

AT = datetime(2031, 1, 1, tzinfo=UTC)


def _row(source: str | None, target: str) -> dict[str, object]:
    return event_row(
        at=AT,
        kind="run.transition",
        tenant_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        from_state=source,
        to_state=target,
    )


@pytest.mark.parametrize(
    ("source", "target"),
    [
        *sorted((s.value, t.value) for s, targets in TRANSITIONS.items() for t in targets),
        (None, "SCHEDULED"),
    ],
)
def test_every_allowed_transition_makes_a_row(source: str | None, target: str) -> None:
    assert _row(source, target)["to_state"] == target


@pytest.mark.parametrize(
    ("source", "target"),
    [("SUCCESS", "SCHEDULED"), ("SKIPPED", "DISPATCHED"), (None, "RUNNING"), ("RUNNING", "NOPE")],
)
def test_a_transition_the_table_forbids_is_refused(source: str | None, target: str) -> None:
    with pytest.raises(IllegalTransitionError):
        _row(source, target)


def test_other_events_are_not_transitions() -> None:
    row = event_row(at=AT, kind="job.paused", tenant_id=None, to_state="paused")
    assert row["kind"] == "job.paused"


def test_illegal_transitions_names_each_bad_pair_once_sorted() -> None:
    pairs = [("SUCCESS", "FAILED"), (None, "SCHEDULED"), ("SCHEDULED", "DISPATCHED")]
    assert illegal_transitions(pairs) == [("SUCCESS", "FAILED")]
    assert illegal_transitions([(s.value, RunState.SCHEDULED.value) for s in RunState]) == [
        ("SCHEDULED", "SCHEDULED"),
        ("SKIPPED", "SCHEDULED"),
        ("SUCCESS", "SCHEDULED"),
    ]
