"""The store of record: PostgreSQL in production, SQLite embedded by default."""

from __future__ import annotations

from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import CHANNEL_KEYS_REVOKED, CHANNEL_RUNS_NEW, CHANNEL_RUNS_READY
from cronwheel.store.values import CompleteItem, FailItem, HeartbeatItem, RunFilter

__all__ = [
    "CHANNEL_KEYS_REVOKED",
    "CHANNEL_RUNS_NEW",
    "CHANNEL_RUNS_READY",
    "CompleteItem",
    "FailItem",
    "HeartbeatItem",
    "RunFilter",
    "Store",
    "Subscription",
    "create_store",
]


def create_store(
    url: str,
    *,
    idle_transaction_timeout: float | None = None,
    pool_size: int = 10,
    pool_overflow: int = 8,
    warm: bool = False,
    max_node_input_bytes: int | None = None,
) -> Store:
    """A store for a normalised database URL (see ``Settings``); call ``open()`` next.
    PostgreSQL only: ``idle_transaction_timeout``, how long the server lets a session
    sit inside a transaction before ending it; ``pool_size``, the connections kept
    open; ``pool_overflow``, how many more may be opened under load; ``warm``, open the
    pool at ``open()`` rather than on demand (see
    :class:`~cronwheel.store.drivers.postgres.PostgresDriver`). Either backend:
    ``max_node_input_bytes``, the most bytes of JSON a workflow's node is given when it
    is made ready, its upstream nodes' results included (by default
    :data:`~cronwheel.domain.workflow.NODE_INPUT_MAX`)."""
    from cronwheel.store.driver import Driver
    from cronwheel.store.sql import SqlStore

    driver: Driver
    if url.startswith("postgresql+asyncpg://"):
        from cronwheel.store.drivers.postgres import PostgresDriver

        driver = PostgresDriver(
            url,
            idle_transaction_timeout=idle_transaction_timeout,
            pool_size=pool_size,
            pool_overflow=pool_overflow,
            warm=warm,
        )
    elif url.startswith("sqlite+aiosqlite://"):
        from cronwheel.store.drivers.sqlite import SqliteDriver

        driver = SqliteDriver(url)
    else:
        raise ValueError(f"unsupported database URL: {url}")
    if max_node_input_bytes is None:
        return SqlStore(driver)
    return SqlStore(driver, node_input_limit=max_node_input_bytes)
