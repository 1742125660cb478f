"""The run state machine: the one place run transitions are defined.

::

                 ┌───────────── cancel ──────────────┐
                 │                                   ▼
    SCHEDULED ──fire──▶ DISPATCHED ──lease──▶ RUNNING ──▶ SUCCESS
      ▲  │  │                │                  │ │ │
      │  │  └──skip──▶ SKIPPED│                  │ │ └──▶ FAILED      (non-retryable error)
      │  │                   │                  │ └────▶ DEAD_LETTER (retries exhausted)
      │  └── cancel ──▶ CANCELLED ◀── cancel ───┴──────── (cooperative)
      │                                         │
      └────────── retry (backoff) ◀─────────────┘   lease lost, timed out or failed with
                                                    attempts left
    DEAD_LETTER / FAILED / CANCELLED ──redrive / retry──▶ SCHEDULED
    SCHEDULED / DISPATCHED / RUNNING ──quarantine──▶ DEAD_LETTER (a poison row)

Who moves runs into and out of each state:

- SCHEDULED: created by the API (one-off jobs), by the scheduler (the next cron
  occurrence), by a retry, or by a redrive. Left when the scheduler fires it, when it
  is skipped (catch-up / overlap policy, or its job edited to a schedule with no place
  for it) or cancelled.
- DISPATCHED: entered only by the scheduler firing a due run (one conditional UPDATE
  per batch), or by a worker shutting down that hands a leased run back. Left when a
  worker leases it, when it is cancelled, or back to SCHEDULED when its job is paused
  (a dispatched run not yet leased waits for the resume).
- RUNNING: entered when a worker leases the run (a new attempt with a new fencing
  token). Left by the worker's completion or failure, by lease expiry or timeout
  (the scheduler), by a cooperative cancel, or back to DISPATCHED when a worker
  shutting down releases it (the try is not counted).
- DEAD_LETTER: entered when retries are exhausted, or from any live state when a step
  of a scheduler pass fails on this run alone (quarantine: ``runs.quarantined_at`` is
  set and the error is the reason), so that one poison row never stops a pass.
- SUCCESS, FAILED, CANCELLED, DEAD_LETTER, SKIPPED: terminal; ``finished_at`` is set
  exactly in these states (a CHECK constraint holds the store to it). FAILED,
  CANCELLED and DEAD_LETTER can be sent back to SCHEDULED by a retry or a redrive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from cronwheel.domain.errors import IllegalTransitionError

__all__ = [
    "ACTIVE_STATES",
    "AWAIT",
    "CANCEL",
    "CONCLUDE",
    "CREATED_AS",
    "FAIL",
    "FINISH",
    "FIRE",
    "MOVES",
    "OVERSIZE",
    "PARK",
    "QUARANTINE",
    "READY",
    "REDRIVE",
    "RELEASE",
    "REOPEN",
    "RETRY",
    "REWIND",
    "SKIP",
    "START",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "UNSATISFIED",
    "AttemptState",
    "JobState",
    "Move",
    "RunState",
    "check_transition",
    "illegal_transitions",
    "sources_of",
]


class RunState(StrEnum):
    PENDING = "PENDING"  # a workflow's node waiting for its upstream nodes
    SCHEDULED = "SCHEDULED"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    DEAD_LETTER = "DEAD_LETTER"
    SKIPPED = "SKIPPED"


TERMINAL_STATES: frozenset[RunState] = frozenset(
    {
        RunState.SUCCESS,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.DEAD_LETTER,
        RunState.SKIPPED,
    }
)
ACTIVE_STATES: frozenset[RunState] = frozenset(RunState) - TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class Move:
    """One named way a run changes state: the states it may leave and those it may
    enter. Every statement that moves runs takes its state precondition from a move
    (``sources``), so the SQL and this table cannot disagree."""

    name: str
    sources: frozenset[RunState]
    targets: frozenset[RunState]

    @property
    def source(self) -> RunState:
        """The one state a single-source move leaves (for its event rows)."""
        (sole,) = self.sources
        return sole

    @property
    def source_values(self) -> list[str]:
        """The source states' values, sorted (for ``IN`` lists and iteration)."""
        return sorted(s.value for s in self.sources)

    def sql(self, column: str = "state") -> str:
        """The precondition as SQL text over ``column`` (for hand-written statements)."""
        values = ", ".join(f"'{v}'" for v in self.source_values)
        return f"{column} = {values}" if len(self.sources) == 1 else f"{column} IN ({values})"


def _move(name: str, sources: Iterable[RunState], targets: Iterable[RunState]) -> Move:
    return Move(name, frozenset(sources), frozenset(targets))


_S, _D, _R = RunState.SCHEDULED, RunState.DISPATCHED, RunState.RUNNING
_P = RunState.PENDING

FIRE = _move("fire", {_S}, {_D})
SKIP = _move("skip", {_S}, {RunState.SKIPPED})  # catch-up or overlap policy; a job edit
# A running run is not moved by a cancel: it is asked to stop, and ends by FINISH/FAIL.
CANCEL = _move("cancel", {_P, _S, _D}, {RunState.CANCELLED})
PARK = _move("park", {_D}, {_S})  # its job paused before a worker took it
START = _move("start", {_D}, {_R})  # leased by a worker, or its reservation confirmed
RELEASE = _move("release", {_R}, {_D})  # handed back by a worker shutting down
# A completion: CANCELLED when a cancel was asked meanwhile.
FINISH = _move("finish", {_R}, {RunState.SUCCESS, RunState.CANCELLED})
# A failed, lost or timed-out attempt: retried, or final.
FAIL = _move("fail", {_R}, {_S, RunState.FAILED, RunState.DEAD_LETTER, RunState.CANCELLED})
QUARANTINE = _move("quarantine", {_P, _S, _D, _R}, {RunState.DEAD_LETTER})  # a poison row
REDRIVE = _move("redrive", {RunState.DEAD_LETTER}, {_S})
RETRY = _move("retry", {RunState.FAILED, RunState.CANCELLED, RunState.DEAD_LETTER}, {_S})
# Workflows (``domain/workflow.py``). A node run waits PENDING until its trigger rule
# holds (READY) or never can (UNSATISFIED); a node retried sends the nodes it had
# skipped or cancelled downstream back to waiting (REWIND), and itself waits for its
# own upstream nodes (AWAIT) unless it is a root. A workflow run is fired
# like any run and started at once by the store (START, with no attempt); it ends
# when its last node does (CONCLUDE), and a node retried reopens it (REOPEN).
READY = _move("ready", {_P}, {_D, _S})  # SCHEDULED: parked, its workflow paused
UNSATISFIED = _move("unsatisfied", {_P}, {RunState.SKIPPED})
REWIND = _move("rewind", {RunState.SKIPPED, RunState.CANCELLED}, {_P})
AWAIT = _move("await", {_S}, {_P})
# A node whose input — its payload with its upstream nodes' results — is over the limit
# when its rule holds: failed, never dispatched (its dependents go on as after a failure).
OVERSIZE = _move("oversize", {_P}, {RunState.FAILED})
CONCLUDE = _move("conclude", {_R}, {RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED})
REOPEN = _move("reopen", {RunState.FAILED, RunState.CANCELLED}, {_R})

MOVES: tuple[Move, ...] = (
    FIRE, SKIP, CANCEL, PARK, START, RELEASE, FINISH, FAIL, QUARANTINE, REDRIVE, RETRY,
    READY, UNSATISFIED, REWIND, AWAIT, OVERSIZE, CONCLUDE, REOPEN,
)  # fmt: skip

# The table every recorded (from_state, to_state) pair is held to: the moves' union.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    state: frozenset(t for m in MOVES if state in m.sources for t in m.targets)
    for state in RunState
}


def check_transition(source: RunState, target: RunState) -> None:
    """Raise :class:`IllegalTransitionError` unless ``source -> target`` is allowed."""
    if target not in TRANSITIONS[source]:
        raise IllegalTransitionError(
            f"a run cannot move from {source.value} to {target.value}",
            source=source.value,
            target=target.value,
        )


# A run's history begins with its creation: no state before it.
CREATED_AS: frozenset[RunState] = frozenset({RunState.SCHEDULED, RunState.PENDING})


def illegal_transitions(
    pairs: Iterable[tuple[str | None, str]],
) -> list[tuple[str | None, str]]:
    """The recorded ``(from_state, to_state)`` pairs that the table does not allow (a
    run is created SCHEDULED: ``from_state`` None). The invariant the store tests and
    the scheduler-cluster test hold every recorded history to."""
    bad: list[tuple[str | None, str]] = []
    for source, target in pairs:
        try:
            to = RunState(target)
            allowed = to in (CREATED_AS if source is None else TRANSITIONS[RunState(source)])
        except ValueError:  # a state that is no state
            allowed = False
        if not allowed:
            bad.append((source, target))
    return sorted(bad, key=lambda p: (p[0] or "", p[1]))


def sources_of(target: RunState) -> frozenset[RunState]:
    """Every state from which ``target`` may be entered (used to build conditional SQL)."""
    return frozenset(s for s, targets in TRANSITIONS.items() if target in targets)


class AttemptState(StrEnum):
    """One execution try. RUNNING while leased; every other state is final."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"  # the lease expired without a heartbeat
    TIMED_OUT = "TIMED_OUT"  # the handler ran past the job's timeout
    CANCELLED = "CANCELLED"
    RELEASED = "RELEASED"  # handed back by a worker shutting down, not counted as a try


class JobState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FINISHED = "finished"
