"""The Alembic migrations build exactly the schema that ``schema.metadata`` describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
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


async def _downgrade(url: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:

            def downgrade(sync_conn: sa.Connection) -> None:
                config.attributes["connection"] = sync_conn
                command.downgrade(config, revision)

            await conn.run_sync(downgrade)
    finally:
        await engine.dispose()


async def _runs_indexes(url: str) -> dict[str, list[str]]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            found = await conn.run_sync(lambda c: sa.inspect(c).get_indexes("runs"))
    finally:
        await engine.dispose()
    return {i["name"]: list(i["column_names"]) for i in found if i["name"]}


async def test_the_history_indexes_go_down_and_up(store_url: str) -> None:
    """0020 down to 0019 and up again: the runs' indexes before it come back, then the
    history's, and the database matches the metadata again."""
    head = await _runs_indexes(store_url)
    assert head["ix_runs_tenant_due"] == ["tenant_id", "due_at", "id"]
    assert head["ix_runs_tenant_state"] == ["tenant_id", "state", "due_at", "id"]
    assert "ix_runs_tenant_job" not in head

    await _downgrade(store_url, "0019")
    before = await _runs_indexes(store_url)
    assert before["ix_runs_tenant_job"] == ["tenant_id", "job_id", "id"]
    assert before["ix_runs_tenant_state"] == ["tenant_id", "state", "id"]
    assert "ix_runs_tenant_due" not in before

    await create_store(store_url).migrate()
    assert await _runs_indexes(store_url) == head
    assert await _compare(store_url) == ([], _head())
