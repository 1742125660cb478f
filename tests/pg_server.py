"""The PostgreSQL server the suite uses: its admin connection and test database URLs.

The suite shares the server with whatever else runs on it, so it waits — within a
bound — for a connection slot when every one is taken, rather than failing a test on
another client's load: the server answers ``too many clients already`` at once, and a
slot is usually free again a moment later.
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from cronwheel.settings import normalise_database_url

__all__ = ["PG_ADMIN_DSN", "pg_admin", "pg_connect", "pg_url"]

PG_ADMIN_DSN = os.environ.get("CRONWHEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# How long to wait for a free connection slot before giving up.
SLOT_WAIT = 60.0


def pg_url(database: str, *, user: str | None = None) -> str:
    """The store URL of ``database`` on the suite's server (as ``user`` if given)."""
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    if user is not None:
        scheme, rest = base.split("://", 1)
        base = f"{scheme}://{user}@{rest.rsplit('@', 1)[-1]}"
    return normalise_database_url(f"{base}/{database}")


async def pg_connect(dsn: str = PG_ADMIN_DSN) -> asyncpg.Connection:
    """A connection to ``dsn``, waiting up to :data:`SLOT_WAIT` seconds while the server
    has no slot free (``too many clients``) or is starting up."""
    deadline = time.monotonic() + SLOT_WAIT
    pause = 0.05
    while True:
        try:
            return await asyncpg.connect(dsn)
        except (asyncpg.TooManyConnectionsError, asyncpg.CannotConnectNowError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


async def pg_admin(sql: str) -> None:
    """Run one administrative statement (CREATE/DROP DATABASE, roles) on the server."""
    conn = await pg_connect()
    try:
        await conn.execute(sql)
    finally:
        await conn.close()
