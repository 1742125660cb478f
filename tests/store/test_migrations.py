"""The Alembic migrations build exactly the schema that ``schema.metadata`` describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

import cronwheel.store
from cronwheel.store import create_store
from cronwheel.store.schema import metadata

MIGRATIONS = Path(cronwheel.store.__file__).parent / "migrations"


async def _compare(url: str, target: sa.MetaData = metadata) -> tuple[list[Any], str | None]:
    def inspect(conn: sa.Connection) -> tuple[list[Any], str | None]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(context, target), context.get_current_revision()

    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(inspect)
    finally:
        await engine.dispose()


def _head() -> str | None:
    script = ScriptDirectory(str(MIGRATIONS))
    return script.get_current_head()


async def test_migrations_match_the_metadata(store_url: str) -> None:
    # ``store_url`` is a database built by running every migration (the fixture's job).
    diff, revision = await _compare(store_url)
    assert diff == []
    assert revision is not None
    assert revision == _head()

    # Migrating an up-to-date database changes nothing.
    await create_store(store_url).migrate()
    assert await _compare(store_url) == ([], revision)


async def test_the_comparison_sees_a_drift(store_url: str) -> None:
    """Proof that the comparison above can fail: a column, an index and a type that the
    migrations do not have are all reported."""
    drifted = sa.MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.tables.values():
        table.to_metadata(drifted)
    runs = drifted.tables["runs"]
    runs.append_column(sa.Column("extra", sa.Integer))
    sa.Index("ix_runs_extra", runs.c.extra)
    drifted.tables["tenants"].c.name.type = sa.String(20)
    diff, _revision = await _compare(store_url, drifted)
    kinds = {entry[0] if isinstance(entry, tuple) else entry[0][0] for entry in diff}
    assert {"add_column", "add_index", "modify_type"} <= kinds
