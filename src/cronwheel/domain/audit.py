"""Who changed what: the actor of a change and the audit record it leaves.

Every change made through the API (and so the CLI, and what is built on them) is done
by an :class:`Actor` — a key, with its role, in one request — and leaves one
:class:`AuditRecord`, written in the transaction of the change itself: a change that
rolled back left none, and one that committed cannot lack its record.

::

    request ──▶ Actor(name, role, key_id, request_id)
                   │
                   ▼
    store method: the change ──┬──▶ events (the history of the job / run: per row)
      (one transaction)        └──▶ audit (one record per change: action, target,
                                    before / after of what changed, reason)

The events table is each job's and run's history, and goes with them when they are
deleted; the audit table outlives them: records leave only by retention
(``audit_retention_days``), and on PostgreSQL a trigger refuses any other UPDATE,
DELETE or TRUNCATE of it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["Actor", "AuditRecord", "changed", "name_of"]


@dataclass(frozen=True, slots=True)
class Actor:
    """Who does something: ``name`` is what the history records (a key's id, ``admin``
    for the admin key of the settings, a scheduler node's id); the rest is what the
    audit trail adds."""

    name: str
    role: str | None = None
    key_id: uuid.UUID | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    at: datetime
    tenant_id: uuid.UUID | None  # None: a change to no one tenant (a pool's share)
    actor: str
    role: str | None
    key_id: uuid.UUID | None
    request_id: str | None
    action: str  # "job.pause", "run.cancel", "tenant.update", "key.revoke", …
    target_kind: str  # "job", "run", "tenant", "key", "pool", …
    target_id: str | None
    reason: str | None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


def changed(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields whose values differ between ``before`` and ``after``, each side with
    only those: what an audit record keeps of a change."""
    keys = [k for k in {**before, **after} if before.get(k) != after.get(k)]
    return {k: before.get(k) for k in keys}, {k: after.get(k) for k in keys}


def name_of(actor: Actor | None) -> str | None:
    """What the history (the events) records of ``actor``."""
    return None if actor is None else actor.name
