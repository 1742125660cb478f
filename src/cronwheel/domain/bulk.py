"""Bulk operations: one action on every job or run a selector matches, accepted at
once and carried out in the background, soonest-due first.

::

    POST /v1/bulk/<action> ──▶ operation PENDING (its audit record with it) ──▶ 202
                                   │  claimed by an API node (a lease, renewed each step;
                                   ▼  another node takes over when it lapses)
                               RUNNING: steps of ≤ STEP rows, each one transaction that
                                   │  changes them and adds to the counts; the rows whose
                                   │  runs are due soonest go first
                                   ▼
                               DONE (or FAILED, with the error; what was done stays done)

The selection is what matched when the operation was accepted: jobs and runs created
later are not touched. A run is never dispatched or leased once its step committed, and
the steps go in the order runs come due, so a selection of any size stops firing within
the first steps (``bench/bulk.py`` measures it).

==========  =======  ========================================================
action      on       does
==========  =======  ========================================================
cancel      runs     cancels those not started, asks running ones to stop
redrive     runs     sends dead letters back (the rules of a single redrive)
pause       jobs     pauses active jobs (their runs held)
resume      jobs     resumes paused jobs
trigger     jobs     a run now for each active or paused job
==========  =======  ========================================================
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from cronwheel.domain.errors import ConflictError, ValidationError

__all__ = [
    "ACTIONS",
    "JOB_ACTIONS",
    "RUN_ACTIONS",
    "SELECTED_IDS_MAX",
    "LeaseLostError",
    "Operation",
    "OperationState",
    "Selector",
]

RUN_ACTIONS = ("cancel", "redrive")
JOB_ACTIONS = ("pause", "resume", "trigger")
ACTIONS = RUN_ACTIONS + JOB_ACTIONS
SELECTED_IDS_MAX = 10_000


class LeaseLostError(ConflictError):
    """The operation is no longer this node's: another claimed it, or it ended."""


class OperationState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Selector:
    """What an operation acts on: every condition given must hold (an empty selector
    matches everything, allowed only with ``all``). ``states`` and ``run_ids`` select
    runs only; the rest select jobs, or the runs of the jobs they select."""

    job_ids: tuple[uuid.UUID, ...] | None = None
    run_ids: tuple[uuid.UUID, ...] | None = None
    tags_all: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    pool: str | None = None
    name_prefix: str | None = None
    states: tuple[str, ...] = ()
    due_after: datetime | None = None  # inclusive
    due_before: datetime | None = None  # exclusive
    all: bool = False

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.job_ids is not None,
                self.run_ids is not None,
                self.tags_all,
                self.tags_any,
                self.pool,
                self.name_prefix,
                self.states,
                self.due_after,
                self.due_before,
            )
        )

    def check(self, action: str) -> None:
        """``ValidationError`` naming the field when the selector does not fit
        ``action``, or selects everything without saying so (``all``)."""
        if action not in ACTIONS:
            raise ValidationError(
                f"unknown action {action!r}: one of {', '.join(ACTIONS)}", field="action"
            )
        if self.empty and not self.all:
            raise ValidationError(
                "an empty selector would act on everything: name what to act on, or "
                'say so with "all": true',
                field="selector",
            )
        if self.all and not self.empty:
            raise ValidationError(
                '"all": true selects everything: give it alone, without other conditions',
                field="selector.all",
            )
        if action in JOB_ACTIONS:
            for name, given in (("run_ids", self.run_ids is not None), ("states", self.states)):
                if given:
                    raise ValidationError(
                        f"{name} selects runs, and {action} acts on jobs", field=f"selector.{name}"
                    )
        for name in ("job_ids", "run_ids"):
            ids = getattr(self, name)
            if ids is not None and len(ids) > SELECTED_IDS_MAX:
                raise ValidationError(
                    f"at most {SELECTED_IDS_MAX} ids, not {len(ids)}", field=f"selector.{name}"
                )
        if self.due_after and self.due_before and self.due_before <= self.due_after:
            raise ValidationError("due_before must be after due_after", field="selector.due_before")

    def to_json(self) -> dict[str, Any]:
        """What the operation records of it: the conditions given."""
        out: dict[str, Any] = {}
        for name in Selector.__dataclass_fields__:
            value = getattr(self, name)
            # An empty list of ids is a condition (it selects nothing), not its absence.
            if value is None or value is False or (value == () and not name.endswith("_ids")):
                continue
            if isinstance(value, tuple):
                value = [str(v) for v in value]
            elif isinstance(value, datetime):
                value = value.isoformat()
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class Operation:
    id: uuid.UUID
    tenant_id: uuid.UUID
    action: str
    selector: dict[str, Any]
    reason: str | None
    actor: str
    state: OperationState
    matched: int  # rows selected so far (all of them once done)
    changed: int
    skipped: dict[str, int]  # why, and how many
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # e.g. running runs asked to stop
