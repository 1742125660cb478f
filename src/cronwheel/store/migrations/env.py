"""Alembic environment: cronwheel runs migrations on a connection it hands in
(``Store.migrate``), never from an ini file."""

from __future__ import annotations

from alembic import context

from cronwheel.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
