"""Creating jobs with SQLAlchemy Core: the tenant's limits read, then one INSERT per
table for the whole batch. SQLite serialises write transactions already, so the
limit's count (``store.sql.pending``) needs no lock of its own here."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.store.driver import Driver, JobsInserted, NewJobRows
from cronwheel.store.schema import audit, jobs, runs, tenants

__all__ = ["CoreJobs"]


class CoreJobs(Driver):
    """Creating jobs, for a driver that speaks SQLAlchemy Core only."""

    async def jobs_insert(
        self,
        conn: AsyncConnection,
        *,
        tenant_id: uuid.UUID,
        rows: NewJobRows,
        admitted: bool,
    ) -> JobsInserted:
        if not admitted:
            limits = (
                await conn.execute(sa.select(tenants.c.limits).where(tenants.c.id == tenant_id))
            ).first()
            if limits is None:
                return "no_tenant"
            if (limits[0] or {}).get("max_pending_runs") is not None:
                return "limited"
        if rows.jobs:
            await conn.execute(jobs.insert(), rows.dicts("jobs"))
        if rows.runs:
            await conn.execute(runs.insert(), rows.dicts("runs"))
        await self.events_insert(conn, rows.dicts("events"))
        if rows.audit:
            await conn.execute(audit.insert(), rows.dicts("audit"))
        return "inserted"
