"""A tenant's ``max_pending_runs``, checked where runs are added on request.

A tenant's *pending* runs are its runs in SCHEDULED or DISPATCHED: made, not yet
leased. Creating jobs, triggering and backfilling add pending runs; each checks, in the
transaction that adds them, that the tenant ends with at most ``max_pending_runs``, and
is refused (:class:`TenantLimitError`, nothing stored) otherwise::

    read the tenant's limits (row FOR KEY SHARE)
      │ no max_pending_runs ──────────────────────────────▶ add the runs (nothing more)
      ▼
    lock the tenant row FOR NO KEY UPDATE      one creator of the tenant at a time
    count pending, LIMIT max + 1               over ix_runs_tenant_state: bounded
      │ count + adding > max ──▶ TenantLimitError, rolled back
      ▼
    add the runs, commit (the lock goes)

The database decides, not any API node: two creators of one tenant on two nodes take
the row lock in turn, so the second counts what the first added. FOR NO KEY UPDATE
does not conflict with the FOR KEY SHARE that inserting a job takes (its foreign key),
so only the tenant's own limited creators wait; a PATCH of the tenant's limits waits
for them (and they for it). On SQLite every write is serialised already. A tenant
without the limit pays one primary-key read (FOR KEY SHARE: its creates do not wait
for each other).

The scheduler adding a recurring job's next occurrence is never refused (a schedule
must not stop silently): those runs count towards the limit, so they can take a tenant
above it, and then its creations are refused until the count comes down. Retries and
runs handed back by workers are not additions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import NotFoundError, TenantLimitError
from cronwheel.domain.states import RunState
from cronwheel.store.schema import runs, tenants

__all__ = ["PENDING_STATES", "PendingLimit", "pending_admit", "tenant_for_new_runs"]

PENDING_STATES = (RunState.SCHEDULED.value, RunState.DISPATCHED.value)
_LIMIT = "max_pending_runs"


@dataclass(frozen=True, slots=True)
class PendingLimit:
    limit: int
    tenant: str  # its name, as metrics label tenants


async def tenant_for_new_runs(conn: AsyncConnection, tenant_id: uuid.UUID) -> PendingLimit | None:
    """The tenant's ``max_pending_runs`` (None: no limit), its row kept until the
    transaction ends (a deletion waits) and, with the limit, locked against the
    tenant's other creators. Not found unless the tenant exists."""
    row = (
        await conn.execute(
            sa.select(tenants.c.name, tenants.c.limits)
            .where(tenants.c.id == tenant_id)
            .with_for_update(read=True, key_share=True)
        )
    ).first()
    if row is None:
        raise NotFoundError(f"tenant {tenant_id} not found", tenant_id=str(tenant_id))
    limit = (row.limits or {}).get(_LIMIT)
    if limit is None:
        return None
    await conn.execute(
        sa.select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
    )
    return PendingLimit(limit=int(limit), tenant=str(row.name))


async def pending_admit(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    *,
    limit: PendingLimit | None,
    adding: int,
    counted: bool = False,
) -> None:
    """Refuse (:class:`TenantLimitError`) unless the tenant's pending runs plus
    ``adding`` stay within ``limit`` (from :func:`tenant_for_new_runs`, in the same
    transaction). ``counted``: the ``adding`` runs are inserted already (a backfill,
    which learns how many it added only by inserting) and so are in the count."""
    if limit is None or adding <= 0:
        return
    tenant, max_pending = limit.tenant, limit.limit
    # At most max_pending + 1 (+ the added) index entries are read, however many there are.
    cap = max_pending + 1 + (adding if counted else 0)
    capped = (
        sa.select(runs.c.id)
        .where(runs.c.tenant_id == tenant_id, runs.c.state.in_(PENDING_STATES))
        .limit(cap)
        .subquery()
    )
    found = int((await conn.execute(sa.select(sa.func.count()).select_from(capped))).scalar_one())
    pending = found - adding if counted else found
    if pending + adding <= max_pending:
        return
    shown = f"more than {max_pending}" if found >= cap else str(pending)
    raise TenantLimitError(
        f"tenant {tenant_id} has {shown} pending runs (scheduled or waiting for a worker) "
        f"and a limit of {max_pending} (max_pending_runs): adding {adding} is refused; wait for "
        "runs to start or finish, cancel some, or raise the limit",
        limit=_LIMIT,
        tenant_id=str(tenant_id),
        tenant=tenant,
        pending=pending,
        adding=adding,
        max=max_pending,
    )
