"""Pools: what an admin sets for one (the share of worker slots kept for P0 runs), what
its live workers can take now, and what waits for them.

A pool is a name: workers register in one, jobs name one. It needs no row to exist; a
row (``pools``) only carries settings that differ from the deployment's defaults.

The P0 reserve is counted per worker, as leasing keeps it: a live worker of capacity
``c`` in a pool whose effective share is ``s`` keeps ``domain.admission.reserved_slots``
``(c, s)`` = ``floor(s * c)`` of its slots for P0 runs. A pool's reserved slots are the
sum over its live workers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "PRIORITY_CLASSES",
    "Pool",
    "PoolBacklog",
    "PoolCapacity",
    "PoolStatus",
    "effective_share",
    "priority_class",
]

# Priorities 0..3 are the classes P0 (leased first) .. P3.
PRIORITY_CLASSES: tuple[int, ...] = (0, 1, 2, 3)


def priority_class(priority: int) -> str:
    """The class name of a priority: ``P0`` .. ``P3``."""
    return f"P{priority}"


def effective_share(share: float | None, default: float) -> float:
    """A pool's P0 share: its own setting, else the deployment's default."""
    return default if share is None else share


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool's settings as stored (no row: every one is None)."""

    name: str
    p0_reserved_share: float | None  # None: the deployment's default
    updated_at: datetime | None  # None: never set


@dataclass(frozen=True, slots=True)
class PoolBacklog:
    """Runs of one tenant and priority class in one pool that wait for a worker: ready
    (DISPATCHED, not reserved: the ready queue) and due (SCHEDULED, fire time come, not
    dispatched yet: held back, or not fired yet)."""

    tenant_id: uuid.UUID
    tenant_name: str
    priority: int
    ready: int
    due: int

    @property
    def total(self) -> int:
        return self.ready + self.due


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """What a pool's live workers can take now (every tenant's work counted)."""

    pool: str
    workers: int  # live workers
    capacity: int  # their slots
    busy: int  # slots held: attempts running and runs reserved on them
    free: int  # slots not held (per worker, never below 0), summed
    p0_reserved_share: float  # effective: the pool's own, else the default
    p0_reserved_slots: int  # sum over the live workers of floor(share * capacity)
    # ``free`` split by whom the workers serve: a tenant's own workers (its id) take
    # only its runs; shared workers (None) any tenant's.
    free_by_owner: dict[uuid.UUID | None, int] = field(default_factory=dict)

    def free_for(self, tenant_id: uuid.UUID) -> int:
        """The free slots that can take ``tenant_id``'s runs: shared and its own."""
        return self.free_by_owner.get(None, 0) + self.free_by_owner.get(tenant_id, 0)


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """A pool as an admin or a tenant sees it.

    For a tenant, the workers are those serving it (its own and the shared ones),
    ``busy`` counts only its own runs on them, ``free`` is None (it depends on other
    tenants' work), and the backlog is its own."""

    name: str
    p0_reserved_share: float | None  # the pool's own setting (None: the default)
    effective_share: float
    workers: int
    capacity: int
    busy: int
    free: int | None
    p0_reserved_slots: int
    backlog: list[PoolBacklog] = field(default_factory=list)

    @property
    def ready(self) -> int:
        return sum(b.ready for b in self.backlog)

    @property
    def due(self) -> int:
        return sum(b.due for b in self.backlog)
