"""Reads planned for the tenant they name (``Driver.planned_each``): on PostgreSQL the
pool status and the workers list run with ``plan_cache_mode = force_custom_plan``, and
no connection goes back to the pool with it — after the read, or after a read cut
off by an error or a cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import sqlalchemy as sa

from cronwheel.store import Store
from cronwheel.store.sql import SqlStore

from .helpers import make_tenant


async def _modes(store: SqlStore, count: int) -> list[str]:
    """The setting on ``count`` pooled connections at once (so: every one the pool holds)."""
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(store.engine.connect()) for _ in range(count)]
        return [(await c.execute(sa.text("SHOW plan_cache_mode"))).scalar_one() for c in conns]


async def test_a_planned_read_leaves_no_connection_with_its_setting(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's plans")
    assert isinstance(store, SqlStore)
    tenant = await make_tenant(store)
    await store.pools_status(tenant.id)
    await store.workers_list(tenant.id)

    async with store._read() as conn, store.driver.planned_each(conn):
        inside = (await conn.execute(sa.text("SHOW plan_cache_mode"))).scalar_one()
    assert inside == "force_custom_plan"

    with pytest.raises(ZeroDivisionError):
        async with store._read() as conn, store.driver.planned_each(conn):
            1 / 0  # noqa: B018

    async def cut_off() -> None:
        async with store._read() as conn, store.driver.planned_each(conn):
            await conn.execute(sa.text("SELECT pg_sleep(5)"))

    task = asyncio.create_task(cut_off())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(await _modes(store, 3)) == {"auto"}
