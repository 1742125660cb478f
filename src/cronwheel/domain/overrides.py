"""Runtime parameter overrides: a change of what runs are made with, for a while,
without editing the job.

An override is a JSON merge-patch (RFC 7396) over a run's payload and new values for
some of its template fields (:data:`FIELDS`: payload, timeout, priority, pool), with a
*scope* that says which runs it reaches::

    run      one run not started yet (its id), until that run starts
    next     the job's next occurrence: its earliest run not started yet of the
             schedule (or a one-off job's run), bound to it when the override is made
             and consumed when it starts (or ends without starting)
    future   every run of the job not started yet, and every run made while it is on:
             until it is removed

A run is made from its *base* — what its job's template, or a trigger's payload, gave
it — and the overrides that reach it, applied in the merge order::

    base  <  future (oldest first)  <  next  <  run (oldest first)

so a later scope wins over an earlier one and, within a scope, a newer override over an
older one. Applying is pure (:func:`applied`): the store keeps each run's base and the
ids of its overrides (``runs.overrides``) and writes the result into the run's own
columns, so workers lease what they always leased, and recomputes it whenever an
override is made or removed, or the job's template is edited.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

__all__ = [
    "FIELDS",
    "MAX_ACTIVE",
    "Override",
    "OverrideScope",
    "RunFields",
    "applied",
    "merge_order",
    "merge_patch",
    "run_overlay",
]

# The template fields an override may set: what may differ from one run to the next
# without it being another job.
FIELDS = ("payload", "timeout", "priority", "pool")

# Overrides on at once on one job (every scope): each is applied on every change of
# the job's runs, and the job's own definition is the place for lasting ones.
MAX_ACTIVE = 100


class OverrideScope(StrEnum):
    RUN = "run"
    NEXT = "next"
    FUTURE = "future"


_RANK = {OverrideScope.FUTURE: 0, OverrideScope.NEXT: 1, OverrideScope.RUN: 2}


@dataclass(frozen=True, slots=True)
class Override:
    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    run_id: uuid.UUID | None  # the run a ``run`` or ``next`` override is bound to
    scope: OverrideScope
    payload: dict[str, Any] | None  # a merge-patch over the payload; None: not changed
    timeout: float | None
    priority: int | None
    pool: str | None
    reason: str | None
    created_by: str | None
    created_at: datetime
    removed_at: datetime | None = None
    removed_by: str | None = None
    # active | consumed (its run started or ended) | removed: a ``run`` or ``next``
    # override is consumed by its run, found so when read (nothing is written when a
    # run starts).
    status: str = "active"

    def changes(self) -> dict[str, Any]:
        """The fields it sets, by name (the payload as its patch)."""
        values = {name: getattr(self, name) for name in FIELDS}
        return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True)
class RunFields:
    """What an override can change of a run."""

    payload: dict[str, Any]
    timeout: float
    priority: int
    pool: str

    def to_json(self) -> dict[str, Any]:
        return {"payload": self.payload, "timeout": self.timeout,
                "priority": self.priority, "pool": self.pool}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunFields:
        return cls(
            payload=dict(data["payload"]),
            timeout=float(data["timeout"]),
            priority=int(data["priority"]),
            pool=str(data["pool"]),
        )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: ``patch`` applied to ``target``, neither changed. An object patch merges
    key by key (``null`` removes the key, an object merges into an object, anything else
    replaces); any other patch replaces the target whole."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def merge_order(overrides: Iterable[Override]) -> list[Override]:
    """``overrides`` in the order they apply: by scope (future, next, run), then oldest
    first (the id, time-ordered, breaks a tie)."""
    return sorted(overrides, key=lambda o: (_RANK[o.scope], o.created_at, o.id))


def applied(base: RunFields, overrides: Iterable[Override]) -> RunFields:
    """``base`` with ``overrides`` applied in the merge order."""
    payload, timeout, priority, pool = base.payload, base.timeout, base.priority, base.pool
    for o in merge_order(overrides):
        if o.payload is not None:
            payload = merge_patch(payload, o.payload)
        timeout = o.timeout if o.timeout is not None else timeout
        priority = o.priority if o.priority is not None else priority
        pool = o.pool if o.pool is not None else pool
    return RunFields(payload=payload, timeout=timeout, priority=priority, pool=pool)


def run_overlay(base: RunFields, overrides: Sequence[Override]) -> dict[str, Any] | None:
    """What ``runs.overrides`` keeps of a run reached by ``overrides``: their ids in the
    merge order and the base to apply them to again. None for none."""
    if not overrides:
        return None
    return {"ids": [str(o.id) for o in merge_order(overrides)], "base": base.to_json()}
