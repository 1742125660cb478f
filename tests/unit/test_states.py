"""The run state machine: exactly the transitions in its table are allowed."""

from __future__ import annotations

import itertools

import pytest

from cronwheel.domain.errors import ConflictError, IllegalTransitionError
from cronwheel.domain.states import (
    ACTIVE_STATES,
    CANCEL,
    FINISH,
    FIRE,
    MOVES,
    QUARANTINE,
    RETRY,
    START,
    TERMINAL_STATES,
    TRANSITIONS,
    RunState,
    check_transition,
    sources_of,
)

ALLOWED = sorted((s, t) for s, targets in TRANSITIONS.items() for t in targets)
FORBIDDEN = sorted(
    (s, t) for s, t in itertools.product(RunState, RunState) if t not in TRANSITIONS[s]
)


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert set(RunState) == TERMINAL_STATES | ACTIVE_STATES
    assert not TERMINAL_STATES & ACTIVE_STATES


@pytest.mark.parametrize(("source", "target"), ALLOWED)
def test_allowed_transition_passes(source: RunState, target: RunState) -> None:
    check_transition(source, target)


@pytest.mark.parametrize(("source", "target"), FORBIDDEN)
def test_forbidden_transition_raises(source: RunState, target: RunState) -> None:
    with pytest.raises(IllegalTransitionError) as caught:
        check_transition(source, target)
    error = caught.value
    assert isinstance(error, ConflictError)
    assert (error.status, error.code) == (409, "illegal_transition")
    assert error.details == {"source": source.value, "target": target.value}
    assert source.value in error.message
    assert target.value in error.message


def test_lifecycle_of_the_requirements() -> None:
    """SCHEDULED -> DISPATCHED -> RUNNING -> SUCCESS | FAILED, or CANCELLED, with
    DEAD_LETTER after the retry limit and SKIPPED with a reason."""
    path = [RunState.SCHEDULED, RunState.DISPATCHED, RunState.RUNNING, RunState.SUCCESS]
    for source, target in itertools.pairwise(path):
        check_transition(source, target)
    for end in (RunState.FAILED, RunState.DEAD_LETTER, RunState.CANCELLED):
        check_transition(RunState.RUNNING, end)
    check_transition(RunState.SCHEDULED, RunState.SKIPPED)
    # Nothing leaves SUCCESS; nothing but a retry leaves the other terminals — and in a
    # workflow, a node retried upstream (SKIPPED, CANCELLED -> PENDING) or a workflow run
    # reopened by it (FAILED, CANCELLED -> RUNNING).
    assert TRANSITIONS[RunState.SUCCESS] == frozenset()
    assert TRANSITIONS[RunState.SKIPPED] == {RunState.PENDING}
    assert TRANSITIONS[RunState.DEAD_LETTER] == {RunState.SCHEDULED}
    assert TRANSITIONS[RunState.FAILED] == {RunState.SCHEDULED, RunState.RUNNING}
    assert TRANSITIONS[RunState.CANCELLED] == {
        RunState.SCHEDULED,
        RunState.PENDING,
        RunState.RUNNING,
    }
    # No state moves to itself.
    assert all(state not in TRANSITIONS[state] for state in RunState)


@pytest.mark.parametrize("target", list(RunState))
def test_sources_of_inverts_the_table(target: RunState) -> None:
    assert sources_of(target) == {s for s in RunState if target in TRANSITIONS[s]}


def test_the_table_is_exactly_what_the_named_moves_allow() -> None:
    """Each statement that moves runs takes its precondition from one move: the table
    is their union, no more. A move's name says where it is done."""
    pairs = {(s, t) for m in MOVES for s in m.sources for t in m.targets}
    assert pairs == set(ALLOWED)
    assert len({m.name for m in MOVES}) == len(MOVES)
    # The hot path, in order: fire, start, finish.
    assert (FIRE.source, START.source, FINISH.source) == (
        RunState.SCHEDULED,
        RunState.DISPATCHED,
        RunState.RUNNING,
    )
    # A cancel moves only runs not yet started; a running one is asked to stop.
    assert CANCEL.sources == {RunState.PENDING, RunState.SCHEDULED, RunState.DISPATCHED}
    assert QUARANTINE.sources == ACTIVE_STATES


def test_a_move_renders_its_precondition_as_sql() -> None:
    assert FIRE.sql() == "state = 'SCHEDULED'"
    assert CANCEL.sql("r.state") == "r.state IN ('DISPATCHED', 'PENDING', 'SCHEDULED')"
    assert RETRY.source_values == ["CANCELLED", "DEAD_LETTER", "FAILED"]
    with pytest.raises(ValueError, match="unpack"):
        _ = RETRY.source  # three sources: no one state to record
