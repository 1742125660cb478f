"""What the store's own transitions feed into the metrics (``cronwheel.metrics``):
executions ended by their workers, retries, dead letters, lease expiries.

Observed where the transition is written, inside its transaction (as the throttle
counter is): a transaction that then rolls back has still been counted, which only a
failed commit does. The ``tenant`` label is the tenant's name, read once per tenant a
process sees (``TENANT_NAMES``), on the transaction's own connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.states import AttemptState, RunState
from cronwheel.metrics import (
    DEAD_LETTERS,
    LEASE_EXPIRIES,
    RETRIES,
    TENANT_NAMES,
    observe_execution,
)
from cronwheel.store.schema import tenants

__all__ = [
    "Execution",
    "count_expiries",
    "count_fates",
    "observe_executions",
    "tenant_labels",
    "tenant_names_of",
]

Execution = tuple[uuid.UUID, str | None, float]
"""(tenant id, task, seconds it ran) of an attempt its worker ended."""


async def tenant_names_of(conn: AsyncConnection, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The names of the tenants of ``ids`` that exist, read now."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = await conn.execute(
        sa.select(tenants.c.id, tenants.c.name).where(tenants.c.id.in_(wanted))
    )
    return {r.id: r.name for r in rows}


async def tenant_labels(conn: AsyncConnection, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The ``tenant`` label of each id: its name, read once per process."""
    return await TENANT_NAMES.names(ids, lambda missing: tenant_names_of(conn, missing))


async def observe_executions(
    conn: AsyncConnection, executions: list[Execution], *, outcome: str
) -> None:
    if not executions:
        return
    names = await tenant_labels(conn, {e[0] for e in executions})
    for tenant_id, task, seconds in executions:
        observe_execution(tenant=names[tenant_id], task=task, outcome=outcome, seconds=seconds)


async def count_fates(conn: AsyncConnection, fates: list[tuple[uuid.UUID, RunState]]) -> None:
    """Retries (back to SCHEDULED after a failed try) and dead letters, by tenant."""
    counted = [(t, s) for t, s in fates if s in (RunState.SCHEDULED, RunState.DEAD_LETTER)]
    if not counted:
        return
    names = await tenant_labels(conn, {t for t, _ in counted})
    for tenant_id, state in counted:
        counter = RETRIES if state is RunState.SCHEDULED else DEAD_LETTERS
        counter.labels(tenant=names[tenant_id]).inc()


def count_expiries(states: Iterable[AttemptState]) -> None:
    for state in states:
        LEASE_EXPIRIES.labels(reason="lost" if state is AttemptState.LOST else "timed_out").inc()
