"""Shared fixtures: a fresh, migrated store per test, on SQLite and on PostgreSQL.

PostgreSQL: the schema is migrated once per session into a template database; each
test gets its own database cloned from it (fast) and dropped afterwards.
SQLite: each test gets its own file, migrated from scratch.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from cronwheel.settings import normalise_database_url
from cronwheel.store import Store, create_store

# Per-test databases, dropped at the end of the session.
_spent: list[str] = []

PG_ADMIN_DSN = os.environ.get("CRONWHEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_url(database: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return normalise_database_url(f"{base}/{database}")


async def _pg_admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Name of a migrated template database, made once per test session."""
    import asyncio

    name = f"cw_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    async def make() -> None:
        await _pg_admin(f'CREATE DATABASE "{name}"')
        store = create_store(_pg_url(name))
        await store.migrate()
        await store.close()

    asyncio.run(make())
    yield name

    async def drop_all() -> None:
        for db in [*_spent, name]:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    asyncio.run(drop_all())
    _spent.clear()


@pytest.fixture
async def pg_url(pg_template: str) -> AsyncIterator[str]:
    """A fresh migrated PostgreSQL database for one test; dropped afterwards."""
    name = f"cw_t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    # Dropped with the template at the end of the session: a drop costs as much as the
    # create, and nothing reuses the name.
    _spent.append(name)
    yield _pg_url(name)


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> AsyncIterator[str]:
    url = normalise_database_url(f"sqlite:///{tmp_path / 'cronwheel.db'}")
    store = create_store(url)
    await store.migrate()
    await store.close()
    yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh migrated database URL, once per backend."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """An open store on a fresh migrated database, once per backend."""
    s = create_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
