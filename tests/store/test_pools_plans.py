"""The pool status reads one tenant's backlog through the ready queue's index, its
tenant an index condition (never a filter over every tenant's runs): PostgreSQL's plans
of the statements ``pools_status`` sends, with one tenant's 2,000 ready runs beside
another's 20."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.store import Store
from cronwheel.store.schema import runs
from cronwheel.store.sql import SqlStore
from cronwheel.store.sql.pools import backlog_statements

from .helpers import T0, at, dispatched_run, engine_of, make_tenant

# Every column of a run, copied; the key made anew.
_COPIED = {c.name: c.name for c in runs.c} | {
    "id": "(md5(random()::text))::uuid",
    "tenant_id": "CAST(:t AS uuid)",
    "due_at": "due_at + i * interval '1 ms'",
}


async def _plan(conn: AsyncConnection, stmt: Any) -> str:
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    values = compiled.construct_params()
    params = tuple(values[k] for k in compiled.positiontup or [])
    rows = await conn.exec_driver_sql(f"EXPLAIN (COSTS OFF) {compiled}", params)
    return "\n".join(r[0] for r in rows)


async def test_one_tenants_ready_count_is_a_range_of_the_ready_index(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's plans")
    assert isinstance(store, SqlStore)
    big, small = await make_tenant(store), await make_tenant(store)
    big_run = await dispatched_run(store, big.id)
    small_run = await dispatched_run(store, small.id, now=at(1))
    async with engine_of(store).begin() as conn:
        # Copies of each tenant's dispatched run (of its own job): 2,000 and 20.
        for tenant, count, template in ((big.id, 2000, big_run), (small.id, 20, small_run)):
            await conn.execute(
                sa.text(
                    f"INSERT INTO runs ({', '.join(_COPIED)}) SELECT {', '.join(_COPIED.values())} "
                    "FROM runs, generate_series(1, :n) AS i WHERE runs.id = CAST(:r AS uuid)"
                ),
                {"t": str(tenant), "n": count, "r": str(template.id)},
            )
        await conn.execute(sa.text("ANALYZE runs"))
    statuses = await store.pools_status(small.id, now=at(2))
    assert [(b.ready, b.tenant_id) for s in statuses for b in s.backlog] == [(21, small.id)]

    async with engine_of(store).connect() as conn:
        await conn.exec_driver_sql("SET enable_seqscan = off")
        ready, _due = backlog_statements(store.driver, small.id, None, T0, ready_pools=["default"])
        plan = await _plan(conn, ready)
    assert "ix_runs_ready" in plan, plan
    cond = next(line for line in plan.splitlines() if "Index Cond" in line)
    assert "tenant_id" in cond and "pool" in cond, plan
